//! A fleet member written outside the agent: an MQTT client that speaks
//! the protocol itself (signed Hello with a join token, sealed messages),
//! so a test can act as a stolen phone would: announce what it likes, ask
//! for as much as it likes, go offline at will. Blocking, for tests.

use std::time::{Duration, Instant};

use tunefleet_common::auth::{self, DownFrame, HelloRefused, Identity, JoinToken, Session, UpFrame};
use tunefleet_common::message::{AgentInfo, AgentMessage, AgentStatus, CoordinatorMessage, CoordinatorStatus};
use tunefleet_common::topic::{AgentTopic, Topics};

use crate::mqtt::TestClient;

/// What a Hello got.
#[derive(Debug)]
pub enum Answer {
    Welcome,
    Refused(HelloRefused),
}

/// One member's connection.
pub struct Member {
    rt: tokio::runtime::Runtime,
    client: TestClient,
    topics: Topics,
    name: String,
    identity: Identity,
    instance: u64,
    seq: u64,
    status: Option<CoordinatorStatus>,
    session: Option<Session>,
    /// Coordinator messages opened and not yet taken.
    inbox: Vec<CoordinatorMessage>,
}

impl Member {
    /// Connects to the broker at `port` as `name` on `root` and waits for
    /// the coordinator's signed status.
    pub fn connect(port: u16, root: &str, name: &str) -> Member {
        Member::connect_with(port, root, name, None)
    }

    /// [`Member::connect`] carrying `secret`, a users-file login the broker asks of agents.
    pub fn connect_with(port: u16, root: &str, name: &str, secret: Option<(&str, &str)>) -> Member {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let topics = Topics::new(root).expect("root");
        let filters = [topics.coordinator_status(), topics.to_agent(name)];
        let identity = Identity::generate().expect("key").0;
        // Logged in as its name with a proof of its key, as the real agent is.
        let login = crate::key_login(&identity, name, secret);
        let client = rt.block_on(async {
            let id = format!("member-{name}-{:08x}", rand_u32());
            let mut client = TestClient::connect_as(port, &id, Some((name, &login))).await.expect("connects");
            client.subscribe(&filters).await;
            client
        });
        let mut m = Member {
            rt,
            client,
            topics,
            name: name.to_string(),
            identity,
            instance: u64::from(rand_u32()) + 1,
            seq: 0,
            status: None,
            session: None,
            inbox: Vec::new(),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while m.status.as_ref().is_none_or(|s| !s.online) {
            assert!(Instant::now() < deadline, "no coordinator status in 30 s");
            m.pump(Duration::from_millis(200));
        }
        m
    }

    /// Says Hello with `info` (its name and instance are this member's),
    /// enrolling with `token` when given; waits for the answer.
    pub fn hello(&mut self, mut info: AgentInfo, token: Option<&JoinToken>) -> Answer {
        let status = self.status.clone().expect("a coordinator status");
        info.agent = self.name.clone();
        info.instance = self.instance;
        self.seq += 1;
        let enrol = token.map(|t| t.prove(&self.identity.public(), &self.name).expect("proof"));
        let (_, will_hash) = auth::new_will(self.instance).expect("will");
        let (signed, pending) =
            auth::hello(&self.identity, info, status.instance, self.seq, will_hash, enrol).expect("hello");
        self.publish(AgentTopic::Hello, auth_frame(&UpFrame::Hello(signed)));
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            assert!(Instant::now() < deadline, "no answer to the Hello in 10 s");
            let Some((topic, payload)) = self.next_frame(Duration::from_millis(200)) else { continue };
            if topic != self.topics.agent(&self.name, AgentTopic::Welcome) {
                self.take(topic, payload);
                continue;
            }
            match tunefleet_common::decode::<DownFrame>(&payload) {
                Ok(DownFrame::Welcome(w)) if pending.answers(&w) => {
                    let session = pending.finish(&self.name, &status.key, &w).expect("welcome opens");
                    self.session = Some(session);
                    return Answer::Welcome;
                }
                Ok(DownFrame::Refused(r)) => {
                    let notice = auth::open_refused(&status.key, &r).expect("signed by the coordinator");
                    return Answer::Refused(notice);
                }
                _ => {}
            }
        }
    }

    /// A fresh broker login proving this member's key (a second connection
    /// of its own), carrying `secret` when given.
    pub fn login(&self, secret: Option<(&str, &str)>) -> String {
        crate::key_login(&self.identity, &self.name, secret)
    }

    /// Sends `msg`, sealed in this member's session.
    pub fn send(&mut self, msg: &AgentMessage) {
        let session = self.session.as_mut().expect("a session");
        let (kind, payload) = session.seal_agent(msg).expect("seal");
        self.publish(kind, payload);
    }

    /// Says it is offline (as an agent's goodbye does): its session ends.
    pub fn go_offline(&mut self) {
        self.send(&AgentMessage::Status(AgentStatus { online: false, instance: self.instance }));
        self.session = None;
    }

    /// The coordinator's messages that arrive within `wait` (bundles opened).
    pub fn receive(&mut self, wait: Duration) -> Vec<CoordinatorMessage> {
        let deadline = Instant::now() + wait;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            if let Some((topic, payload)) = self.next_frame(left.min(Duration::from_millis(100))) {
                self.take(topic, payload);
            }
        }
        std::mem::take(&mut self.inbox)
    }

    /// Publishes `payload` on `topic` as it is (a broker user's forgery).
    pub fn publish_raw(&mut self, topic: &str, payload: Vec<u8>, retain: bool) {
        self.rt.block_on(self.client.publish(topic, payload, retain)).expect("publish");
        // Let the event loop write it.
        self.pump(Duration::from_millis(100));
    }

    /// Disconnects from the broker, once everything sent before is written.
    pub fn disconnect(self) {
        let Member { rt, mut client, .. } = self;
        rt.block_on(async move {
            let _ = client.disconnect().await;
            assert!(client.wait_closed(Duration::from_secs(10)).await, "disconnected in time");
        });
    }

    fn take(&mut self, topic: String, payload: Vec<u8>) {
        if topic == self.topics.coordinator_status() {
            if let Ok(signed) = tunefleet_common::decode::<auth::Signed>(&payload) {
                if let Ok(s) = auth::open_status(&signed) {
                    self.status = Some(s);
                }
            }
            return;
        }
        let Some(kind) = topic.rsplit('/').next().and_then(|k| AgentTopic::ALL.into_iter().find(|t| t.as_str() == k))
        else {
            return;
        };
        let (Some(session), Ok(DownFrame::Sealed(sealed))) =
            (self.session.as_mut(), tunefleet_common::decode::<DownFrame>(&payload))
        else {
            return;
        };
        if let Ok(msg) = session.open_coordinator(kind, &sealed) {
            match msg {
                CoordinatorMessage::Bundle(_) => self.inbox.extend(msg.unbundle().unwrap_or_default()),
                other => self.inbox.push(other),
            }
        }
    }

    fn pump(&mut self, wait: Duration) {
        if let Some((topic, payload)) = self.next_frame(wait) {
            self.take(topic, payload);
        }
    }

    fn next_frame(&mut self, wait: Duration) -> Option<(String, Vec<u8>)> {
        self.rt.block_on(self.client.next_message(wait)).ok()
    }

    fn publish(&self, kind: AgentTopic, payload: Vec<u8>) {
        let topic = self.topics.agent(&self.name, kind);
        self.rt.block_on(self.client.publish(topic, payload, false)).expect("publish");
    }
}

fn auth_frame(frame: &UpFrame) -> Vec<u8> {
    tunefleet_common::encode(frame).expect("encode")
}

fn rand_u32() -> u32 {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    nanos ^ std::process::id().rotate_left(16)
}
