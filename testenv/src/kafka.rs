//! A Kafka broker of a test's own, from the test environment's jars, for tests that stop and
//! restart the broker (which the shared one must never do under other tests).

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};

use crate::TestEnv;

pub struct PrivateKafka {
    dir: tempfile::TempDir,
    libs: PathBuf,
    port: u16,
    child: Option<Child>,
}

/// `N` distinct free ports: the listeners are all held until every port is known, so that the
/// system cannot hand the same port out twice.
fn free_ports<const N: usize>() -> [u16; N] {
    let listeners: [TcpListener; N] =
        std::array::from_fn(|_| TcpListener::bind("127.0.0.1:0").expect("a free port"));
    listeners.map(|l| l.local_addr().expect("a bound port").port())
}

impl PrivateKafka {
    /// Formats a single-node KRaft broker in a temp dir and starts it; waits until it answers.
    pub fn start(env: &TestEnv) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let [port, controller] = free_ports();
        let props = format!(
            "process.roles=broker,controller\nnode.id=1\n\
             controller.quorum.voters=1@127.0.0.1:{controller}\n\
             listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}\n\
             advertised.listeners=PLAINTEXT://127.0.0.1:{port}\n\
             controller.listener.names=CONTROLLER\ninter.broker.listener.name=PLAINTEXT\n\
             listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT\n\
             log.dirs={}\nnum.partitions=1\noffsets.topic.replication.factor=1\n\
             offsets.topic.num.partitions=2\ntransaction.state.log.replication.factor=1\n\
             transaction.state.log.min.isr=1\nshare.coordinator.state.topic.replication.factor=1\n\
             share.coordinator.state.topic.min.isr=1\ngroup.initial.rebalance.delay.ms=0\n\
             auto.create.topics.enable=false\n",
            dir.path().join("data").display()
        );
        std::fs::write(dir.path().join("server.properties"), props).expect("properties");
        std::fs::write(
            dir.path().join("log4j2.properties"),
            "status = error\nrootLogger.level = ERROR\n",
        )
        .expect("log config");
        let mut kafka = Self {
            libs: env.kafka_libs.clone(),
            dir,
            port,
            child: None,
        };
        let uuid = kafka.java(&["kafka.tools.StorageTool", "random-uuid"]);
        let uuid = String::from_utf8_lossy(&uuid.stdout).trim().to_owned();
        let config = kafka.dir.path().join("server.properties");
        let format = kafka.java(&[
            "kafka.tools.StorageTool",
            "format",
            "-t",
            &uuid,
            "-c",
            &config.to_string_lossy(),
        ]);
        assert!(
            format.status.success(),
            "formatting the private broker: {format:?}"
        );
        kafka.restart();
        kafka
    }

    fn command(&self) -> Command {
        let mut command = Command::new("java");
        command
            .args(["-Xms128m", "-Xmx512m", "-Djava.awt.headless=true"])
            .arg(format!(
                "-Dlog4j2.configurationFile={}",
                self.dir.path().join("log4j2.properties").display()
            ))
            .arg("-cp")
            .arg(format!("{}/*", self.libs.display()));
        command
    }

    fn java(&self, args: &[&str]) -> std::process::Output {
        self.command().args(args).output().expect("run java")
    }

    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", self.bootstrap());
        config
    }

    /// Stops the broker (SIGSTOP) without closing its sockets: requests to it wait unanswered,
    /// as they do on a broker that hangs or a network that drops packets.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Lets a [`Self::pause`]d broker run again (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, name: &str) {
        let child = self.child.as_ref().expect("the broker runs");
        let status = Command::new("kill")
            .args([name, &child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success(), "kill {name} the private broker");
    }

    /// Kills the broker at once (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the broker on the same port and data, and waits until it serves metadata.
    pub fn restart(&mut self) {
        self.kill();
        let config = self.dir.path().join("server.properties");
        let child = self
            .command()
            .arg("kafka.Kafka")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the private broker");
        self.child = Some(child);
        let probe: BaseConsumer = self
            .config()
            .set("group.id", "probe")
            .create()
            .expect("probe client");
        let deadline = std::time::Instant::now() + Duration::from_secs(90);
        while probe
            .fetch_metadata(None, Duration::from_secs(2))
            .map_or(true, |md| md.brokers().is_empty())
        {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                panic!("the private broker exited ({status}) before serving");
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the private broker did not come up on {}",
                self.bootstrap()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for PrivateKafka {
    fn drop(&mut self) {
        self.kill();
    }
}
