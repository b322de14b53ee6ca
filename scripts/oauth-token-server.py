#!/usr/bin/env python3
"""The test environment's OAuth 2 authorization server, for the broker's OAUTHBEARER listeners.

Standard library and the openssl CLI only, so a fresh machine needs nothing new:

  oauth-token-server.py jwks SIGNING_KEY KID
      prints the JSON Web Key Set of the RSA key, which the broker reads from a file.
  oauth-token-server.py serve --signing-key K --kid KID --cert C --key K --client-id ID
      --client-secret-file F --issuer ISS --audience AUD --lifetime S --port P --listen ADDR...
      serves POST /token over HTTPS on each ADDR:P: the client credentials grant (RFC 6749
      4.4, client authenticated with HTTP Basic as librdkafka sends it, or in the form) answered
      with an RS256-signed JWT that expires after S seconds. Wrong credentials get 401
      invalid_client, so a client with a wrong secret fails the way it does against a real IdP.
"""

import argparse
import base64
import hmac
import json
import ssl
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def jwks(signing_key: str, kid: str) -> dict:
    out = subprocess.run(
        ["openssl", "rsa", "-in", signing_key, "-noout", "-modulus"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()
    modulus = bytes.fromhex(out.split("=", 1)[1])
    return {"keys": [{"kty": "RSA", "use": "sig", "alg": "RS256", "kid": kid,
                      "n": b64url(modulus), "e": b64url((65537).to_bytes(3, "big"))}]}


def sign(signing_key: str, message: bytes) -> bytes:
    return subprocess.run(
        ["openssl", "dgst", "-sha256", "-sign", signing_key],
        input=message, check=True, capture_output=True,
    ).stdout


def token(args, subject: str, scope: str | None) -> str:
    now = int(time.time())
    header = {"alg": "RS256", "typ": "JWT", "kid": args.kid}
    claims = {"iss": args.issuer, "aud": args.audience, "sub": subject, "iat": now,
              "nbf": now, "exp": now + args.lifetime, "jti": str(uuid.uuid4())}
    if scope:
        claims["scope"] = scope
    signing_input = ".".join(b64url(json.dumps(part, separators=(",", ":")).encode())
                             for part in (header, claims))
    signature = sign(args.signing_key, signing_input.encode())
    return f"{signing_input}.{b64url(signature)}"


def handler(args, secret: str):
    class Token(BaseHTTPRequestHandler):
        def reply(self, status: int, body: dict, extra=()):
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            for name, value in extra:
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        def credentials(self, form):
            auth = self.headers.get("Authorization", "")
            if auth.startswith("Basic "):
                try:
                    pair = base64.b64decode(auth[6:]).decode()
                except ValueError:
                    return None, None
                client_id, _, client_secret = pair.partition(":")
                return unquote(client_id), unquote(client_secret)
            return form.get("client_id", [None])[0], form.get("client_secret", [None])[0]

        def do_POST(self):
            if self.path.split("?")[0] != "/token":
                return self.reply(404, {"error": "not_found"})
            length = int(self.headers.get("Content-Length") or 0)
            form = parse_qs(self.rfile.read(length).decode(errors="replace"))
            if form.get("grant_type", [None])[0] != "client_credentials":
                return self.reply(400, {"error": "unsupported_grant_type"})
            client_id, client_secret = self.credentials(form)
            if client_id != args.client_id or not hmac.compare_digest(
                    (client_secret or "").encode(), secret.encode()):
                return self.reply(401, {"error": "invalid_client"},
                                  [("WWW-Authenticate", 'Basic realm="topk-testenv"')])
            scope = form.get("scope", [None])[0]
            self.reply(200, {"access_token": token(args, client_id, scope),
                             "token_type": "Bearer", "expires_in": args.lifetime})

        def log_message(self, fmt, *fmt_args):
            sys.stderr.write("%s %s\n" % (self.address_string(), fmt % fmt_args))

    return Token


def serve(args):
    with open(args.client_secret_file) as f:
        secret = f.read().strip()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(args.cert, args.key)
    servers = []
    for address in args.listen:
        server = ThreadingHTTPServer((address, args.port), handler(args, secret))
        server.socket = context.wrap_socket(server.socket, server_side=True)
        servers.append(server)
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in servers]
    for t in threads:
        t.start()
    print(f"serving https://{{{','.join(args.listen)}}}:{args.port}/token", file=sys.stderr)
    for t in threads:
        t.join()


def main():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    j = sub.add_parser("jwks")
    j.add_argument("signing_key")
    j.add_argument("kid")
    s = sub.add_parser("serve")
    for name in ("signing-key", "kid", "cert", "key", "client-id", "client-secret-file",
                 "issuer", "audience"):
        s.add_argument(f"--{name}", required=True)
    s.add_argument("--lifetime", type=int, default=3600)
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--listen", action="append", required=True)
    args = parser.parse_args()
    if args.command == "jwks":
        json.dump(jwks(args.signing_key, args.kid), sys.stdout)
    else:
        serve(args)


if __name__ == "__main__":
    main()
