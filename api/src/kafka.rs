//! How a metric's Kafka clients reach their cluster: TLS, SASL and a few allowed client
//! properties, written the way Strimzi's users write them, with every credential referenced
//! from a Secret of the metric's namespace. The spec and the rendered config carry only the
//! references; [`KafkaSecurity::properties`] turns them into librdkafka properties given a
//! way to read a Secret's key (the mounted files in a pod, the Kubernetes API in the
//! operator), so every client of the metric is configured by this one function.

use std::collections::BTreeMap;
use std::fmt;

use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Where the operator mounts the referenced Secret keys in data-plane pods: each as
/// `SECRET/KEY` (see [`SecretKey::path`]).
pub const KAFKA_SECRETS_DIR: &str = "/var/run/secrets/topk/kafka";

/// Client properties a spec may set through `config`: connection and network tuning only.
/// Everything that decides what is read, written or committed (group ids, offsets,
/// idempotence, acks, isolation), and the security settings the typed fields own, stays out,
/// so a passthrough cannot change counting or leak around the Secrets.
pub const ALLOWED_CLIENT_PROPERTIES: &[&str] = &[
    "broker.address.family",
    "broker.address.ttl",
    "client.dns.lookup",
    "client.id",
    "client.rack",
    "connections.max.idle.ms",
    "metadata.max.age.ms",
    "reconnect.backoff.max.ms",
    "reconnect.backoff.ms",
    "retry.backoff.max.ms",
    "retry.backoff.ms",
    "socket.connection.setup.timeout.ms",
    "socket.keepalive.enable",
    "socket.nagle.disable",
    "socket.receive.buffer.bytes",
    "socket.send.buffer.bytes",
    "socket.timeout.ms",
    "ssl.cipher.suites",
    "ssl.curves.list",
    "ssl.endpoint.identification.algorithm",
    "ssl.sigalgs.list",
    "topic.metadata.refresh.interval.ms",
];

/// librdkafka properties whose values are credentials: never shown.
const SENSITIVE_PROPERTIES: &[&str] = &[
    "sasl.password",
    "ssl.key.pem",
    "sasl.oauthbearer.client.secret",
];

/// TLS to the brokers. `tls: {}` trusts the system's CAs (public CAs, as managed clouds use).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KafkaTls {
    /// CA certificates (PEM) the brokers' certificates must chain to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub trusted_certificates: Vec<CertificateSecret>,
}

/// A PEM certificate in a Secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CertificateSecret {
    #[schemars(length(min = 1, max = 253))]
    pub secret_name: String,
    /// The Secret's key holding the certificate, e.g. `ca.crt`.
    #[schemars(length(min = 1, max = 253))]
    pub certificate: String,
}

/// How the clients authenticate to the brokers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum AuthenticationType {
    #[serde(rename = "scram-sha-512")]
    ScramSha512,
    #[serde(rename = "scram-sha-256")]
    ScramSha256,
    #[serde(rename = "plain")]
    Plain,
    /// Mutual TLS: a client certificate and key.
    #[serde(rename = "tls")]
    Tls,
    /// SASL OAUTHBEARER with tokens from an OAuth 2 / OIDC token endpoint (client
    /// credentials grant), as MSK, Confluent Cloud and Strimzi with Keycloak use.
    #[serde(rename = "oauth")]
    Oauth,
}

impl AuthenticationType {
    /// The name a spec uses.
    fn name(self) -> &'static str {
        match self {
            AuthenticationType::ScramSha512 => "scram-sha-512",
            AuthenticationType::ScramSha256 => "scram-sha-256",
            AuthenticationType::Plain => "plain",
            AuthenticationType::Tls => "tls",
            AuthenticationType::Oauth => "oauth",
        }
    }

    fn sasl_mechanism(self) -> Option<&'static str> {
        match self {
            AuthenticationType::ScramSha512 => Some("SCRAM-SHA-512"),
            AuthenticationType::ScramSha256 => Some("SCRAM-SHA-256"),
            AuthenticationType::Plain => Some("PLAIN"),
            AuthenticationType::Oauth => Some("OAUTHBEARER"),
            AuthenticationType::Tls => None,
        }
    }

    /// Whether this type signs in with a username and a password.
    fn takes_password(self) -> bool {
        matches!(
            self,
            AuthenticationType::ScramSha512
                | AuthenticationType::ScramSha256
                | AuthenticationType::Plain
        )
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[x_kube(
    validation = Rule::new("(self.type == 'tls') == has(self.certificateAndKey)")
        .message("type tls takes certificateAndKey, and only type tls does"),
    validation = Rule::new("(self.type == 'oauth') == (has(self.clientId) && has(self.clientSecret) && has(self.tokenEndpointUri))")
        .message("type oauth takes clientId, clientSecret and tokenEndpointUri, and only type oauth does"),
    validation = Rule::new("self.type == 'oauth' || (!has(self.scope) && !has(self.tlsTrustedCertificates))")
        .message("scope and tlsTrustedCertificates belong to type oauth"),
    validation = Rule::new("(self.type in ['scram-sha-512', 'scram-sha-256', 'plain']) == (has(self.username) && has(self.passwordSecret))")
        .message("the password types (scram-sha-512, scram-sha-256, plain) take username and passwordSecret, and only they do")
)]
pub struct KafkaAuthentication {
    #[serde(rename = "type")]
    pub kind: AuthenticationType,
    /// The SASL user (`scram-sha-512`, `scram-sha-256`, `plain`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    /// The SASL user's password.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_secret: Option<PasswordSecret>,
    /// The client certificate and key (`tls`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate_and_key: Option<CertificateAndKey>,
    /// The OAuth client's id (`oauth`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_id: Option<String>,
    /// The OAuth client's secret (`oauth`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_secret: Option<GenericSecret>,
    /// The authorization server's token endpoint (`oauth`), `https://` (or `http://` inside a
    /// trusted network). The clients fetch tokens from it with the client credentials grant and
    /// fetch new ones before they expire.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_endpoint_uri: Option<String>,
    /// The scope to ask the token endpoint for (`oauth`; space-separated); none by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    /// CA certificates (PEM) the token endpoint's certificate must chain to (`oauth`); the
    /// system's CAs when absent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tls_trusted_certificates: Vec<CertificateSecret>,
}

/// One key of a Secret, e.g. an OAuth client secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GenericSecret {
    #[schemars(length(min = 1, max = 253))]
    pub secret_name: String,
    /// The Secret's key holding the value.
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PasswordSecret {
    #[schemars(length(min = 1, max = 253))]
    pub secret_name: String,
    /// The Secret's key holding the password.
    #[schemars(length(min = 1, max = 253))]
    pub password: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CertificateAndKey {
    #[schemars(length(min = 1, max = 253))]
    pub secret_name: String,
    /// The Secret's key holding the client certificate (PEM), e.g. `user.crt`.
    #[schemars(length(min = 1, max = 253))]
    pub certificate: String,
    /// The Secret's key holding its private key (PEM, unencrypted), e.g. `user.key`.
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

/// One key of one Secret in the metric's namespace.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SecretKey {
    pub secret: String,
    pub key: String,
}

impl SecretKey {
    fn new(secret: &str, key: &str) -> Self {
        Self {
            secret: secret.to_owned(),
            key: key.to_owned(),
        }
    }

    /// Its file, relative to [`KAFKA_SECRETS_DIR`]: Secret names hold no `/`, so every
    /// (Secret, key) has a path of its own.
    pub fn path(&self) -> String {
        format!("{}/{}", self.secret, self.key)
    }
}

impl fmt::Display for SecretKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "key {:?} of Secret {:?}", self.key, self.secret)
    }
}

/// Everything but the address that says how to connect: TLS, authentication and allowed
/// client properties. Empty means plaintext without authentication.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KafkaSecurity {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<KafkaTls>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authentication: Option<KafkaAuthentication>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub config: BTreeMap<String, String>,
}

/// A Secret key that could not be read, or a client that cannot be configured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CredentialError {
    #[error("{key}: {reason}")]
    Unreadable { key: SecretKey, reason: String },
    #[error("invalid Kafka client settings: {0}")]
    Invalid(String),
}

impl KafkaSecurity {
    pub fn is_plaintext(&self) -> bool {
        *self == Self::default()
    }

    /// librdkafka's `security.protocol` for these settings.
    pub fn protocol(&self) -> &'static str {
        let sasl = self
            .authentication
            .as_ref()
            .is_some_and(|a| a.kind.sasl_mechanism().is_some());
        match (self.tls.is_some(), sasl) {
            (false, false) => "plaintext",
            (true, false) => "ssl",
            (false, true) => "sasl_plaintext",
            (true, true) => "sasl_ssl",
        }
    }

    /// What is wrong with the settings, as messages about the field `at` (for example
    /// `spec.source.kafka`; empty if nothing).
    pub fn problems(&self, at: &str) -> Vec<String> {
        let mut problems = Vec::new();
        for name in self.config.keys() {
            if !ALLOWED_CLIENT_PROPERTIES.contains(&name.as_str()) {
                problems.push(format!(
                    "{at}.config: {name:?} cannot be set here; allowed: {}",
                    ALLOWED_CLIENT_PROPERTIES.join(", ")
                ));
            }
        }
        let Some(auth) = &self.authentication else {
            return problems;
        };
        let tls_at = format!("{at}.tls");
        let at = format!("{at}.authentication");
        let kind = auth.kind;
        if kind == AuthenticationType::Tls {
            if self.tls.is_none() {
                problems.push(format!(
                    "{at}: type tls authenticates with a client certificate over TLS; set {tls_at} too"
                ));
            }
            if auth.certificate_and_key.is_none() {
                problems.push(format!("{at}: type tls needs certificateAndKey"));
            }
        } else if auth.certificate_and_key.is_some() {
            problems.push(format!("{at}: certificateAndKey belongs to type tls"));
        }
        if kind.takes_password() {
            if auth.username.as_deref().is_none_or(|u| u.trim().is_empty()) {
                problems.push(format!("{at}: type {} needs username", kind.name()));
            }
            if auth.password_secret.is_none() {
                problems.push(format!("{at}: type {} needs passwordSecret", kind.name()));
            }
        } else if auth.username.is_some() || auth.password_secret.is_some() {
            problems.push(format!(
                "{at}: username and passwordSecret belong to types scram-sha-512, scram-sha-256 and plain, not {}",
                kind.name()
            ));
        }
        if kind == AuthenticationType::Oauth {
            if auth
                .client_id
                .as_deref()
                .is_none_or(|c| c.trim().is_empty())
            {
                problems.push(format!("{at}: type oauth needs clientId"));
            }
            if auth.client_secret.is_none() {
                problems.push(format!("{at}: type oauth needs clientSecret"));
            }
            match auth.token_endpoint_uri.as_deref() {
                None => problems.push(format!("{at}: type oauth needs tokenEndpointUri")),
                Some(uri) if !(uri.starts_with("https://") || uri.starts_with("http://")) => {
                    problems.push(format!(
                        "{at}.tokenEndpointUri: {uri:?} is not an https:// (or http://) URL"
                    ))
                }
                Some(_) => {}
            }
            // The scope goes into the token request's form body as it is.
            if auth
                .scope
                .as_deref()
                .is_some_and(|s| s.contains(['&', '=']))
            {
                problems.push(format!(
                    "{at}.scope: scopes are space-separated names; '&' and '=' are not allowed"
                ));
            }
        } else if auth.client_id.is_some()
            || auth.client_secret.is_some()
            || auth.token_endpoint_uri.is_some()
            || auth.scope.is_some()
            || !auth.tls_trusted_certificates.is_empty()
        {
            problems.push(format!(
                "{at}: clientId, clientSecret, tokenEndpointUri, scope and tlsTrustedCertificates belong to type oauth, not {}",
                kind.name()
            ));
        }
        problems
    }

    /// Every Secret key the settings reference, sorted, each once.
    pub fn secret_keys(&self) -> Vec<SecretKey> {
        let mut keys: Vec<SecretKey> = Vec::new();
        if let Some(tls) = &self.tls {
            keys.extend(
                tls.trusted_certificates
                    .iter()
                    .map(|c| SecretKey::new(&c.secret_name, &c.certificate)),
            );
        }
        if let Some(auth) = &self.authentication {
            if let Some(p) = &auth.password_secret {
                keys.push(SecretKey::new(&p.secret_name, &p.password));
            }
            if let Some(c) = &auth.certificate_and_key {
                keys.push(SecretKey::new(&c.secret_name, &c.certificate));
                keys.push(SecretKey::new(&c.secret_name, &c.key));
            }
            if let Some(c) = &auth.client_secret {
                keys.push(SecretKey::new(&c.secret_name, &c.key));
            }
            keys.extend(
                auth.tls_trusted_certificates
                    .iter()
                    .map(|c| SecretKey::new(&c.secret_name, &c.certificate)),
            );
        }
        keys.sort();
        keys.dedup();
        keys
    }

    /// The librdkafka properties of a client of `bootstrap` with these settings; `read`
    /// returns the text of a Secret key. Certificates and keys go in as PEM text, so pods
    /// (reading files) and the operator (reading the API) configure clients alike.
    pub fn properties(
        &self,
        bootstrap: &str,
        mut read: impl FnMut(&SecretKey) -> Result<String, String>,
    ) -> Result<KafkaProperties, CredentialError> {
        let problems = self.problems("kafka");
        if !problems.is_empty() {
            return Err(CredentialError::Invalid(problems.join("; ")));
        }
        let mut read = |key: SecretKey| {
            read(&key).map_err(|reason| CredentialError::Unreadable { key, reason })
        };
        let mut properties: BTreeMap<String, String> = self.config.clone();
        properties.insert("bootstrap.servers".to_owned(), bootstrap.to_owned());
        properties.insert("security.protocol".to_owned(), self.protocol().to_owned());
        if let Some(tls) = &self.tls {
            match pem_bundle(&tls.trusted_certificates, &mut read)? {
                Some(bundle) => properties.insert("ssl.ca.pem".to_owned(), bundle),
                None => properties.insert("ssl.ca.location".to_owned(), "probe".to_owned()),
            };
        }
        if let Some(auth) = &self.authentication {
            if let Some(mechanism) = auth.kind.sasl_mechanism() {
                properties.insert("sasl.mechanism".to_owned(), mechanism.to_owned());
            }
            if let Some(username) = &auth.username {
                properties.insert("sasl.username".to_owned(), username.clone());
            }
            if let Some(p) = &auth.password_secret {
                let password = read(SecretKey::new(&p.secret_name, &p.password))?;
                properties.insert("sasl.password".to_owned(), one_line(&password));
            }
            if auth.kind == AuthenticationType::Oauth {
                // librdkafka's built-in OIDC client: it fetches a token with the client
                // credentials grant before connecting and a new one before each expires.
                properties.insert("sasl.oauthbearer.method".to_owned(), "oidc".to_owned());
                let oauth = [
                    ("sasl.oauthbearer.client.id", &auth.client_id),
                    (
                        "sasl.oauthbearer.token.endpoint.url",
                        &auth.token_endpoint_uri,
                    ),
                    ("sasl.oauthbearer.scope", &auth.scope),
                ];
                for (name, value) in oauth {
                    if let Some(value) = value {
                        properties.insert(name.to_owned(), value.clone());
                    }
                }
            }
            if let Some(c) = &auth.client_secret {
                let secret = read(SecretKey::new(&c.secret_name, &c.key))?;
                properties.insert(
                    "sasl.oauthbearer.client.secret".to_owned(),
                    one_line(&secret),
                );
            }
            if auth.kind == AuthenticationType::Oauth {
                let bundle = pem_bundle(&auth.tls_trusted_certificates, &mut read)?;
                match bundle {
                    Some(bundle) => properties.insert("https.ca.pem".to_owned(), bundle),
                    None => properties.insert("https.ca.location".to_owned(), "probe".to_owned()),
                };
            }
            if let Some(c) = &auth.certificate_and_key {
                let certificate = read(SecretKey::new(&c.secret_name, &c.certificate))?;
                let key = read(SecretKey::new(&c.secret_name, &c.key))?;
                properties.insert("ssl.certificate.pem".to_owned(), certificate);
                properties.insert("ssl.key.pem".to_owned(), key);
            }
        }
        Ok(KafkaProperties(properties))
    }
}

/// A secret as one line: a trailing newline from `echo value > file` is not part of it.
fn one_line(value: &str) -> String {
    value.trim_end_matches(['\r', '\n']).to_owned()
}

/// The certificates, read and joined into one PEM bundle; `None` for none (the system's CAs).
fn pem_bundle(
    certificates: &[CertificateSecret],
    read: &mut impl FnMut(SecretKey) -> Result<String, CredentialError>,
) -> Result<Option<String>, CredentialError> {
    if certificates.is_empty() {
        return Ok(None);
    }
    let mut bundle = String::new();
    for cert in certificates {
        let pem = read(SecretKey::new(&cert.secret_name, &cert.certificate))?;
        bundle.push_str(pem.trim_end());
        bundle.push('\n');
    }
    Ok(Some(bundle))
}

/// The librdkafka properties of one Kafka client, credentials included. Its `Debug` never
/// shows a credential.
#[derive(Clone, PartialEq, Eq)]
pub struct KafkaProperties(BTreeMap<String, String>);

impl KafkaProperties {
    /// A client of `bootstrap` over plaintext without authentication.
    pub fn plaintext(bootstrap: &str) -> Self {
        Self(BTreeMap::from([(
            "bootstrap.servers".to_owned(),
            bootstrap.to_owned(),
        )]))
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    pub fn bootstrap(&self) -> &str {
        self.0.get("bootstrap.servers").map_or("", String::as_str)
    }

    /// `text` (an error from a client made with these properties) with every credential's
    /// value replaced: librdkafka's configuration errors quote the value they refuse.
    pub fn redact(&self, text: &str) -> String {
        let mut text = text.to_owned();
        for (name, value) in &self.0 {
            let value = value.trim();
            if SENSITIVE_PROPERTIES.contains(&name.as_str()) && !value.is_empty() {
                text = text.replace(value, "[redacted]");
            }
        }
        text
    }

    /// Equal for equal properties: a client made from one set serves any equal set.
    pub fn fingerprint(&self) -> u64 {
        let bytes = serde_json::to_vec(&self.0).unwrap_or_default();
        xxhash_rust::xxh3::xxh3_64(&bytes)
    }
}

impl fmt::Debug for KafkaProperties {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown = self.0.iter().map(|(k, v)| {
            let v = if SENSITIVE_PROPERTIES.contains(&k.as_str()) {
                "[redacted]"
            } else {
                v.as_str()
            };
            (k, v)
        });
        f.debug_map().entries(shown).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Authentication of `kind` with nothing set.
    fn bare(kind: AuthenticationType) -> KafkaAuthentication {
        KafkaAuthentication {
            kind,
            username: None,
            password_secret: None,
            certificate_and_key: None,
            client_id: None,
            client_secret: None,
            token_endpoint_uri: None,
            scope: None,
            tls_trusted_certificates: Vec::new(),
        }
    }

    fn scram() -> KafkaSecurity {
        KafkaSecurity {
            tls: Some(KafkaTls {
                trusted_certificates: vec![
                    CertificateSecret {
                        secret_name: "cluster-ca".into(),
                        certificate: "ca.crt".into(),
                    },
                    CertificateSecret {
                        secret_name: "old-ca".into(),
                        certificate: "ca.crt".into(),
                    },
                ],
            }),
            authentication: Some(KafkaAuthentication {
                username: Some("topk".into()),
                password_secret: Some(PasswordSecret {
                    secret_name: "topk-user".into(),
                    password: "password".into(),
                }),
                ..bare(AuthenticationType::ScramSha512)
            }),
            config: BTreeMap::from([("client.rack".into(), "zone-a".into())]),
        }
    }

    fn files(key: &SecretKey) -> Result<String, String> {
        match (key.secret.as_str(), key.key.as_str()) {
            ("cluster-ca", "ca.crt") => Ok("CA1\n".into()),
            ("old-ca", "ca.crt") => Ok("CA2".into()),
            ("topk-user", "password") => Ok("s3cret\n".into()),
            ("topk-user", "user.crt") => Ok("CERT".into()),
            ("topk-user", "user.key") => Ok("KEY".into()),
            ("oauth-client", "secret") => Ok("client-s3cret\n".into()),
            ("idp-ca", "ca.crt") => Ok("IDPCA".into()),
            _ => Err("no such key".into()),
        }
    }

    #[test]
    fn scram_over_tls_reads_every_referenced_key() {
        let props = scram().properties("b:9093", files).unwrap();
        let map: BTreeMap<&str, &str> = props.iter().collect();
        assert_eq!(map["security.protocol"], "sasl_ssl");
        assert_eq!(map["sasl.mechanism"], "SCRAM-SHA-512");
        assert_eq!(map["sasl.username"], "topk");
        assert_eq!(map["sasl.password"], "s3cret");
        assert_eq!(map["ssl.ca.pem"], "CA1\nCA2\n");
        assert_eq!(map["client.rack"], "zone-a");
        assert_eq!(props.bootstrap(), "b:9093");
        let shown = format!("{props:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert_eq!(
            scram().secret_keys(),
            vec![
                SecretKey::new("cluster-ca", "ca.crt"),
                SecretKey::new("old-ca", "ca.crt"),
                SecretKey::new("topk-user", "password"),
            ]
        );
    }

    #[test]
    fn mutual_tls_and_system_cas() {
        let security = KafkaSecurity {
            tls: Some(KafkaTls::default()),
            authentication: Some(KafkaAuthentication {
                certificate_and_key: Some(CertificateAndKey {
                    secret_name: "topk-user".into(),
                    certificate: "user.crt".into(),
                    key: "user.key".into(),
                }),
                ..bare(AuthenticationType::Tls)
            }),
            config: BTreeMap::new(),
        };
        let props = security.properties("b:9093", files).unwrap();
        let map: BTreeMap<&str, &str> = props.iter().collect();
        assert_eq!(map["security.protocol"], "ssl");
        assert_eq!(map["ssl.ca.location"], "probe");
        assert_eq!(map["ssl.certificate.pem"], "CERT");
        assert!(!map.contains_key("sasl.mechanism"));
        assert!(!format!("{props:?}").contains("KEY\""));
    }

    #[test]
    fn a_missing_key_names_the_secret() {
        let mut security = scram();
        security.authentication.as_mut().unwrap().password_secret = Some(PasswordSecret {
            secret_name: "gone".into(),
            password: "password".into(),
        });
        let err = security.properties("b", files).unwrap_err();
        assert_eq!(
            err.to_string(),
            "key \"password\" of Secret \"gone\": no such key"
        );
    }

    #[test]
    fn settings_that_cannot_work_are_refused_before_any_read() {
        let mut security = scram();
        security
            .config
            .insert("enable.auto.commit".into(), "true".into());
        security.authentication.as_mut().unwrap().username = None;
        let problems = security.problems("spec.source.kafka");
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("\"enable.auto.commit\" cannot be set"));
        assert!(problems[1].contains("needs username"));
        let tls_without_tls = KafkaSecurity {
            authentication: Some(KafkaAuthentication {
                username: Some("x".into()),
                ..bare(AuthenticationType::Tls)
            }),
            ..Default::default()
        };
        assert_eq!(tls_without_tls.problems("spec.source.kafka").len(), 3);
        assert!(
            tls_without_tls
                .properties("b", |_| panic!("read before validating"))
                .is_err()
        );
        assert_eq!(KafkaSecurity::default().protocol(), "plaintext");
    }

    fn oauth() -> KafkaSecurity {
        KafkaSecurity {
            tls: Some(KafkaTls::default()),
            authentication: Some(KafkaAuthentication {
                client_id: Some("topk".into()),
                client_secret: Some(GenericSecret {
                    secret_name: "oauth-client".into(),
                    key: "secret".into(),
                }),
                token_endpoint_uri: Some("https://idp.example/token".into()),
                scope: Some("kafka".into()),
                tls_trusted_certificates: vec![CertificateSecret {
                    secret_name: "idp-ca".into(),
                    certificate: "ca.crt".into(),
                }],
                ..bare(AuthenticationType::Oauth)
            }),
            config: BTreeMap::new(),
        }
    }

    #[test]
    fn oauth_uses_librdkafkas_oidc_client_with_the_secret_and_the_idps_ca() {
        let props = oauth().properties("b:9093", files).unwrap();
        let map: BTreeMap<&str, &str> = props.iter().collect();
        assert_eq!(map["security.protocol"], "sasl_ssl");
        assert_eq!(map["sasl.mechanism"], "OAUTHBEARER");
        assert_eq!(map["sasl.oauthbearer.method"], "oidc");
        assert_eq!(map["sasl.oauthbearer.client.id"], "topk");
        assert_eq!(map["sasl.oauthbearer.client.secret"], "client-s3cret");
        assert_eq!(
            map["sasl.oauthbearer.token.endpoint.url"],
            "https://idp.example/token"
        );
        assert_eq!(map["sasl.oauthbearer.scope"], "kafka");
        assert_eq!(map["https.ca.pem"], "IDPCA\n");
        assert_eq!(map["ssl.ca.location"], "probe");
        assert!(!map.contains_key("sasl.username"));
        assert!(!format!("{props:?}").contains("client-s3cret"));
        assert_eq!(
            props.redact("invalid value \"client-s3cret\" for sasl.oauthbearer.client.secret"),
            "invalid value \"[redacted]\" for sasl.oauthbearer.client.secret"
        );
        assert_eq!(
            oauth().secret_keys(),
            vec![
                SecretKey::new("idp-ca", "ca.crt"),
                SecretKey::new("oauth-client", "secret"),
            ]
        );

        let mut system_cas = oauth();
        let auth = system_cas.authentication.as_mut().unwrap();
        auth.tls_trusted_certificates.clear();
        auth.scope = None;
        let props = system_cas.properties("b:9093", files).unwrap();
        let map: BTreeMap<&str, &str> = props.iter().collect();
        assert_eq!(map["https.ca.location"], "probe");
        assert!(!map.contains_key("sasl.oauthbearer.scope"));
    }

    #[test]
    fn oauth_settings_that_cannot_work_say_which_field() {
        let mut security = oauth();
        let auth = security.authentication.as_mut().unwrap();
        auth.token_endpoint_uri = Some("idp.example/token".into());
        auth.scope = Some("kafka&grant_type=password".into());
        auth.client_secret = None;
        auth.username = Some("topk".into());
        let problems = security.problems("spec.source.kafka");
        assert_eq!(problems.len(), 4, "{problems:?}");
        assert!(
            problems[0].contains("belong to types scram-sha-512"),
            "{problems:?}"
        );
        assert!(problems[1].contains("needs clientSecret"), "{problems:?}");
        assert!(problems[2].contains("is not an https://"), "{problems:?}");
        assert!(problems[3].contains("'&' and '='"), "{problems:?}");

        let mut scram_with_oauth_fields = scram();
        scram_with_oauth_fields
            .authentication
            .as_mut()
            .unwrap()
            .client_id = Some("topk".into());
        let problems = scram_with_oauth_fields.problems("spec.source.kafka");
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("belong to type oauth, not scram-sha-512"));
    }
}
