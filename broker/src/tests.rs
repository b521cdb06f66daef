//! The embedded broker against real clients (rumqttc, raw sockets), both engines where it matters.

use std::collections::HashSet;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
#[cfg(feature = "rumqttd")]
use std::sync::PoisonError;
use std::time::{Duration, Instant};

use rumqttc::{AsyncClient, Event, EventLoop, LastWill, MqttOptions, Packet, QoS};
use rustix::process::{getpid, pidfd_getfd, pidfd_open, PidfdFlags, PidfdGetfdFlags};

#[cfg(feature = "rumqttd")]
use super::rumqttd::STARTING;
use super::sockets::{socket_fds, to_std};
use super::*;

/// The engines built in: the rumqttd one only with its feature.
const ENGINES: &[BrokerEngine] = &[
    BrokerEngine::Native,
    #[cfg(feature = "rumqttd")]
    BrokerEngine::Rumqttd,
];

fn settings(engine: BrokerEngine) -> BrokerSettings {
    BrokerSettings { listen: "127.0.0.1:0".parse().expect("addr"), engine, ..BrokerSettings::default() }
}

#[test]
fn chooses_a_port_and_accepted_sockets_have_nodelay() {
    for &engine in ENGINES {
        let broker = start(&settings(engine)).expect("broker starts");
        assert_ne!(broker.addr.port(), 0);
        assert!(broker.nodelay);
        let before: HashSet<u64> = socket_fds().into_iter().map(|(_, i)| i).collect();
        let client = TcpStream::connect(broker.addr).expect("connects");
        let client_port = client.local_addr().expect("addr").port();
        // The accepted socket is ours too (same process): find it and read its option.
        let pidfd = pidfd_open(getpid(), PidfdFlags::empty()).expect("pidfd");
        // The socket exists from `accept` on, a moment before the broker sets the option:
        // wait for the option, not only for the socket.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let accepted = socket_fds().into_iter().filter(|(_, i)| !before.contains(i)).find_map(|(fd, _)| {
                let dup = pidfd_getfd(&pidfd, fd, PidfdGetfdFlags::empty()).ok()?;
                let peer = rustix::net::getpeername(&dup).ok()??;
                (to_std(&peer)?.port() == client_port).then_some(dup)
            });
            let nodelay = accepted.as_ref().map(|sock| rustix::net::sockopt::tcp_nodelay(sock).expect("getsockopt"));
            if nodelay == Some(true) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{engine:?}: {}",
                if accepted.is_some() {
                    "accepted socket lacks nodelay"
                } else {
                    "broker never accepted the connection"
                }
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

#[test]
fn brokers_started_at_once_each_find_their_own_port() {
    for &engine in ENGINES {
        let starts: Vec<_> = (0..3).map(|_| std::thread::spawn(move || start(&settings(engine)))).collect();
        let mut ports: Vec<u16> =
            starts.into_iter().map(|t| t.join().expect("thread").expect("broker starts").addr.port()).collect();
        ports.sort_unstable();
        ports.dedup();
        assert_eq!(ports.len(), 3, "three brokers, three ports: {ports:?}");
        for port in ports {
            TcpStream::connect(("127.0.0.1", port)).expect("each broker accepts");
        }
    }
}

#[test]
fn a_taken_port_is_a_clear_error() {
    for &engine in ENGINES {
        // Opened under STARTING, so a rumqttd starting in another test cannot take it for its own.
        let taken = {
            #[cfg(feature = "rumqttd")]
            let _starting = STARTING.lock().unwrap_or_else(PoisonError::into_inner);
            std::net::TcpListener::bind("127.0.0.1:0").expect("bind")
        };
        let addr = taken.local_addr().expect("addr");
        let err = start(&BrokerSettings { listen: addr, ..settings(engine) }).expect_err("port is taken");
        assert!(err.to_string().contains(&addr.to_string()), "{err}");
    }
}

fn client(addr: SocketAddr, id: &str, setup: impl FnOnce(&mut MqttOptions)) -> (AsyncClient, EventLoop) {
    let mut o = MqttOptions::new(id, addr.ip().to_string(), addr.port());
    o.set_keep_alive(Duration::from_secs(5)).set_max_packet_size(MAX_PAYLOAD + 1024, MAX_PAYLOAD + 1024);
    setup(&mut o);
    AsyncClient::new(o, 100)
}

/// Polls until the connection is acknowledged; the ConnAck's code.
async fn connack(ev: &mut EventLoop) -> Result<(), rumqttc::ConnectionError> {
    loop {
        if let Event::Incoming(Packet::ConnAck(_)) = ev.poll().await? {
            return Ok(());
        }
    }
}

/// Polls (answering what the client must) until `pick` takes an incoming packet, for at most 10 s.
async fn until<T>(ev: &mut EventLoop, what: &str, mut pick: impl FnMut(Packet) -> Option<T>) -> T {
    let wait = async {
        loop {
            if let Event::Incoming(p) = ev.poll().await.expect("connection") {
                if let Some(t) = pick(p) {
                    return t;
                }
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), wait).await.unwrap_or_else(|_| panic!("no {what} in time"))
}

/// The next publish: its topic, payload and retain flag.
async fn next_publish(ev: &mut EventLoop) -> (String, Vec<u8>, bool) {
    until(ev, "publish", |p| match p {
        Packet::Publish(p) => Some((p.topic, p.payload.to_vec(), p.retain)),
        _ => None,
    })
    .await
}

/// Until a publish is acknowledged.
async fn puback(ev: &mut EventLoop) {
    until(ev, "puback", |p| matches!(p, Packet::PubAck(_)).then_some(())).await
}

/// Until the subscription is acknowledged.
async fn suback(ev: &mut EventLoop) {
    until(ev, "suback", |p| matches!(p, Packet::SubAck(_)).then_some(())).await
}

/// Polls until the broker closes the connection, for at most 10 s.
async fn closed(ev: &mut EventLoop, what: &str) {
    let gone = tokio::time::timeout(Duration::from_secs(10), async { while ev.poll().await.is_ok() {} }).await;
    assert!(gone.is_ok(), "{what}");
}

/// Keeps an event loop polled in the background.
fn drive(mut ev: EventLoop) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move { while ev.poll().await.is_ok() {} })
}

#[tokio::test]
async fn routes_retains_and_publishes_wills() {
    let b = start(&settings(BrokerEngine::Native)).expect("broker");
    let (sub, mut sub_ev) = client(b.addr, "sub", |_| {});
    connack(&mut sub_ev).await.expect("connects");

    // A retained status, then an agent that will die without DISCONNECT.
    let (agent, mut agent_ev) = client(b.addr, "agent-1", |o| {
        o.set_last_will(LastWill::new("r/up/agent-1/status", "offline", QoS::AtLeastOnce, true));
    });
    connack(&mut agent_ev).await.expect("connects");
    agent.publish("r/up/agent-1/status", QoS::AtLeastOnce, true, "online").await.expect("publish");
    puback(&mut agent_ev).await;
    let agent_task = drive(agent_ev);

    sub.subscribe("r/up/+/status", QoS::AtLeastOnce).await.expect("subscribe");
    suback(&mut sub_ev).await;
    assert_eq!(next_publish(&mut sub_ev).await, ("r/up/agent-1/status".into(), b"online".to_vec(), true));

    agent.publish("r/up/agent-1/result", QoS::AtLeastOnce, false, "not subscribed").await.expect("publish");
    agent.publish("r/up/agent-1/status", QoS::AtLeastOnce, false, "live").await.expect("publish");
    assert_eq!(
        next_publish(&mut sub_ev).await,
        ("r/up/agent-1/status".into(), b"live".to_vec(), false),
        "only the subscribed topic, live, without the retain flag"
    );

    // Lost without DISCONNECT: its will goes out, and stays retained.
    agent_task.abort();
    let _ = agent_task.await;
    drop(agent);
    assert_eq!(next_publish(&mut sub_ev).await, ("r/up/agent-1/status".into(), b"offline".to_vec(), false));
    let (late, mut late_ev) = client(b.addr, "late", |_| {});
    connack(&mut late_ev).await.expect("connects");
    late.subscribe("r/up/#", QoS::AtMostOnce).await.expect("subscribe");
    suback(&mut late_ev).await;
    assert_eq!(next_publish(&mut late_ev).await, ("r/up/agent-1/status".into(), b"offline".to_vec(), true));
    // An empty retained publish forgets it.
    late.publish("r/up/agent-1/status", QoS::AtLeastOnce, true, "").await.expect("publish");
    assert_eq!(next_publish(&mut late_ev).await.1, Vec::<u8>::new());
    late.publish("r/up/marker", QoS::AtLeastOnce, true, "marker").await.expect("publish");
    assert_eq!(next_publish(&mut late_ev).await.1, b"marker".to_vec());
    let (later, mut later_ev) = client(b.addr, "later", |_| {});
    connack(&mut later_ev).await.expect("connects");
    later.subscribe("r/up/#", QoS::AtMostOnce).await.expect("subscribe");
    suback(&mut later_ev).await;
    assert_eq!(
        next_publish(&mut later_ev).await,
        ("r/up/marker".into(), b"marker".to_vec(), true),
        "the forgotten status is not retained, the marker is"
    );
    let counters = b.counters.expect("native counters");
    assert!(counters.delivered.load(Ordering::Relaxed) >= 5);
}

#[tokio::test]
async fn a_client_id_connecting_again_takes_over_without_its_will() {
    let b = start(&settings(BrokerEngine::Native)).expect("broker");
    let (watch, mut watch_ev) = client(b.addr, "watch", |_| {});
    connack(&mut watch_ev).await.expect("connects");
    watch.subscribe("t/#", QoS::AtLeastOnce).await.expect("subscribe");
    suback(&mut watch_ev).await;
    let will = |o: &mut MqttOptions| {
        o.set_last_will(LastWill::new("t/status", "offline", QoS::AtLeastOnce, true));
    };
    let (_first, mut first_ev) = client(b.addr, "same", will);
    connack(&mut first_ev).await.expect("connects");
    let (second, mut second_ev) = client(b.addr, "same", will);
    connack(&mut second_ev).await.expect("connects");
    // The first is closed by the broker.
    closed(&mut first_ev, "the first connection was closed").await;
    second.publish("t/status", QoS::AtLeastOnce, false, "online").await.expect("publish");
    let _second = drive(second_ev);
    let (topic, payload, _) = next_publish(&mut watch_ev).await;
    assert_eq!((topic.as_str(), payload.as_slice()), ("t/status", b"online".as_slice()), "no 'offline' will first");
    let counters = b.counters.expect("counters");
    assert_eq!(counters.taken_over.load(Ordering::Relaxed), 1);
}

#[tokio::test]
async fn logins_are_checked_and_bad_packets_close_only_their_connection() {
    let users = HashMap::from([("agent".to_string(), "secret".to_string())]);
    let b = start(&BrokerSettings { users: Some(users), ..settings(BrokerEngine::Native) }).expect("broker");
    let counters = b.counters.clone().expect("counters");
    let (_c, mut ev) = client(b.addr, "wrong", |o| {
        o.set_credentials("agent", "guess");
    });
    let refused = connack(&mut ev).await.expect_err("a wrong password is refused");
    assert!(format!("{refused:?}").contains("BadUserNamePassword"), "{refused:?}");
    let (_c, mut ev) = client(b.addr, "anon", |_| {});
    let refused = connack(&mut ev).await.expect_err("no login is refused");
    assert!(format!("{refused:?}").contains("NotAuthorized"), "{refused:?}");
    assert_eq!(counters.refused.load(Ordering::Relaxed), 2);

    let (ok, mut ok_ev) = client(b.addr, "ok", |o| {
        o.set_credentials("agent", "secret");
    });
    connack(&mut ok_ev).await.expect("the right login connects");
    ok.subscribe("x/#", QoS::AtLeastOnce).await.expect("subscribe");
    suback(&mut ok_ev).await;
    // Garbage on another connection: that one closes, this one goes on.
    let mut raw = TcpStream::connect(b.addr).expect("connect");
    std::io::Write::write_all(&mut raw, &[0x10, 0x04, 0xde, 0xad, 0xbe, 0xef]).expect("write");
    let deadline = Instant::now() + Duration::from_secs(10);
    while counters.refused.load(Ordering::Relaxed) < 3 {
        assert!(Instant::now() < deadline, "the bad CONNECT was never refused");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // A packet over the limit closes its sender.
    let (big, mut big_ev) = client(b.addr, "big", |o| {
        o.set_credentials("agent", "secret");
    });
    connack(&mut big_ev).await.expect("connects");
    big.publish("x/big", QoS::AtLeastOnce, false, vec![0u8; MAX_PAYLOAD + 10]).await.expect("queued");
    closed(&mut big_ev, "the oversized sender was closed").await;
    assert_eq!(counters.malformed.load(Ordering::Relaxed), 1);
    ok.publish("x/small", QoS::AtLeastOnce, false, "still here").await.expect("publish");
    assert_eq!(next_publish(&mut ok_ev).await.1, b"still here".to_vec());
}

/// A raw client that connects, subscribes to `filter` at `qos`, then never reads again.
async fn silent_subscriber(addr: SocketAddr, id: &str, filter: &str, qos: QoS) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let mut raw = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let mut out = bytes::BytesMut::new();
    let connect = rumqttc::mqttbytes::v4::Connect::new(id);
    rumqttc::mqttbytes::v4::Packet::Connect(connect).write(&mut out, usize::MAX).expect("encode");
    let sub = rumqttc::mqttbytes::v4::Subscribe::new(filter, qos);
    rumqttc::mqttbytes::v4::Packet::Subscribe(sub).write(&mut out, usize::MAX).expect("encode");
    raw.write_all(&out).await.expect("write");
    raw
}

/// A subscriber polled in the background, counting the publishes it gets.
fn counting(mut ev: EventLoop) -> (tokio::task::JoinHandle<()>, std::sync::Arc<AtomicU64>) {
    let got = std::sync::Arc::new(AtomicU64::new(0));
    let g = got.clone();
    let task = tokio::spawn(async move {
        while let Ok(e) = ev.poll().await {
            if let Event::Incoming(Packet::Publish(_)) = e {
                g.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    (task, got)
}

#[tokio::test]
async fn a_subscriber_that_reads_nothing_never_makes_a_publisher_wait() {
    // A stall far longer than the test: only the bounded queues can save it.
    let stall = Duration::from_secs(600);
    let b = start_native_with(&settings(BrokerEngine::Native), stall, serve::MAX_SOCKETS).expect("broker");
    let counters = b.counters.clone().expect("counters");
    // Two silent subscribers to everything: one at QoS 0 (loses copies), one at QoS 1 (loses its connection).
    let quiet0 = silent_subscriber(b.addr, "stuck0", "#", QoS::AtMostOnce).await;
    let quiet1 = silent_subscriber(b.addr, "stuck1", "#", QoS::AtLeastOnce).await;
    // A healthy subscriber beside them.
    let (ok, mut ok_ev) = client(b.addr, "ok", |_| {});
    connack(&mut ok_ev).await.expect("connects");
    ok.subscribe("s/#", QoS::AtLeastOnce).await.expect("subscribe");
    suback(&mut ok_ev).await;
    let (_ok_task, got) = counting(ok_ev);
    // Publish far more than the silent ones' sockets and queues hold.
    let (publisher, pub_ev) = client(b.addr, "pub", |_| {});
    let _pub_task = drive(pub_ev);
    let payload = vec![7u8; 64 * 1024];
    let n = 2_000u64;
    for _ in 0..n {
        publisher.publish("s/x", QoS::AtLeastOnce, false, payload.clone()).await.expect("queued");
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while got.load(Ordering::Relaxed) < n {
        assert!(
            Instant::now() < deadline,
            "the healthy subscriber got {} of {n} (dropped {}, closed {})",
            got.load(Ordering::Relaxed),
            counters.dropped.load(Ordering::Relaxed),
            counters.slow_closed.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(counters.dropped.load(Ordering::Relaxed) > 0, "the QoS 0 one lost copies");
    assert_eq!(counters.slow_closed.load(Ordering::Relaxed), 1, "the QoS 1 one was disconnected");
    assert_eq!(counters.stalled.load(Ordering::Relaxed), 0, "nobody waited for the stall");
    drop((quiet0, quiet1));
}

#[tokio::test]
async fn mqtt5_and_mqtt31_connects_get_a_refusal_not_silence() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let b = start(&settings(BrokerEngine::Native)).expect("broker");
    let counters = b.counters.clone().expect("counters");
    // MQTT 5 CONNECT: "MQTT", level 5, clean start, keep-alive 60, no properties, client id "v5".
    let v5 = [0x10, 0x0f, 0, 4, b'M', b'Q', b'T', b'T', 5, 0x02, 0, 60, 0, 0, 2, b'v', b'5'];
    // MQTT 3.1 CONNECT: "MQIsdp", level 3, client id "v3".
    let v3 = [0x10, 0x10, 0, 6, b'M', b'Q', b'I', b's', b'd', b'p', 3, 0x02, 0, 60, 0, 2, b'v', b'3'];
    for (connect, want) in [(&v5[..], &[0x20u8, 0x03, 0x00, 0x84, 0x00][..]), (&v3[..], &[0x20, 0x02, 0x00, 0x01][..])]
    {
        let mut raw = tokio::net::TcpStream::connect(b.addr).await.expect("connect");
        raw.write_all(connect).await.expect("write");
        let mut got = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), raw.read_to_end(&mut got)).await;
        assert!(read.is_ok(), "answered and closed at once");
        assert_eq!(got, want, "the refusal its specification asks for");
    }
    assert_eq!(counters.refused_protocol.load(Ordering::Relaxed), 2);
}

#[tokio::test]
async fn a_retained_flood_is_bounded_at_its_real_cost_and_a_subscribe_walks_a_bounded_part() {
    let b = start(&settings(BrokerEngine::Native)).expect("broker");
    let counters = b.counters.clone().expect("counters");
    let (publisher, mut pub_ev) = client(b.addr, "pub", |_| {});
    connack(&mut pub_ev).await.expect("connects");
    let _pub = drive(pub_ev);
    // 5,000 retained messages on 31-level topics: about 20 KiB each in the tree, counted as such.
    let deep = "d/".repeat(30);
    for i in 0..5_000 {
        publisher.publish(format!("{deep}{i}"), QoS::AtMostOnce, true, "x").await.expect("queued");
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while counters.retained.load(Ordering::Relaxed) + counters.retained_refused.load(Ordering::Relaxed) < 5_000 {
        assert!(Instant::now() < deadline, "the retained publishes were not all handled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let bytes = counters.retained_bytes.load(Ordering::Relaxed);
    let kept = counters.retained.load(Ordering::Relaxed);
    assert!(bytes >= kept * 31 * 512, "a 31-level topic counted at its tree's cost: {bytes} for {kept}");
    // A client subscribing to everything gets at most its share, at once.
    let (sub, mut sub_ev) = client(b.addr, "sub", |_| {});
    connack(&mut sub_ev).await.expect("connects");
    sub.subscribe("#", QoS::AtMostOnce).await.expect("subscribe");
    suback(&mut sub_ev).await;
    let (_t, got) = counting(sub_ev);
    publisher.publish("marker", QoS::AtMostOnce, false, "m").await.expect("queued");
    let deadline = Instant::now() + Duration::from_secs(10);
    while got.load(Ordering::Relaxed) < 2_049 {
        assert!(Instant::now() < deadline, "got {} of the 2,048 retained and the marker", got.load(Ordering::Relaxed));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(got.load(Ordering::Relaxed), 2_049, "2,048 retained copies and the live marker, no more");
}

#[tokio::test]
async fn hostile_topics_connects_and_socket_floods_are_bounded() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let b = start_native_with(&settings(BrokerEngine::Native), STALL, 4).expect("broker");
    let counters = b.counters.clone().expect("counters");
    let (ok, mut ok_ev) = client(b.addr, "ok", |_| {});
    connack(&mut ok_ev).await.expect("connects");
    ok.subscribe("x/#", QoS::AtLeastOnce).await.expect("subscribe");
    suback(&mut ok_ev).await;

    // A topic of 30,000 levels (the routing trees are walked recursively):
    // refused, its sender closed, the broker alive.
    let (deep, mut deep_ev) = client(b.addr, "deep", |_| {});
    connack(&mut deep_ev).await.expect("connects");
    deep.publish("x/".repeat(30_000) + "x", QoS::AtLeastOnce, false, "boom").await.expect("queued");
    closed(&mut deep_ev, "the sender of the deep topic was closed").await;
    assert_eq!(counters.malformed.load(Ordering::Relaxed), 1);
    // ... and a filter as deep is refused, the connection kept.
    ok.subscribe("y/".repeat(100) + "#", QoS::AtLeastOnce).await.expect("subscribe");
    let codes = until(&mut ok_ev, "suback", |p| match p {
        Packet::SubAck(s) => Some(s.return_codes),
        _ => None,
    })
    .await;
    assert_eq!(codes, vec![rumqttc::SubscribeReasonCode::Failure]);
    assert_eq!(counters.refused_filters.load(Ordering::Relaxed), 1);

    // A CONNECT announcing a megabyte is refused at once, not read.
    let mut raw = tokio::net::TcpStream::connect(b.addr).await.expect("connect");
    // Fixed header: CONNECT, remaining length 1,048,576 (varint 0x80 0x80 0x40).
    raw.write_all(&[0x10, 0x80, 0x80, 0x40]).await.expect("write");
    let mut byte = [0u8; 1];
    let read = tokio::time::timeout(Duration::from_secs(5), raw.read(&mut byte)).await;
    assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "closed at once, not after the CONNECT timeout: {read:?}");

    // Sockets past the bound (4 here: `ok` and three idle ones) are closed at once.
    let idle = idle_sockets(3, b.addr).await;
    let mut extra = tokio::net::TcpStream::connect(b.addr).await.expect("connect");
    let read = tokio::time::timeout(Duration::from_secs(5), extra.read(&mut byte)).await;
    assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "the socket over the bound is closed: {read:?}");
    assert!(counters.over_capacity.load(Ordering::Relaxed) >= 1);
    drop(idle);
    // The broker still routes.
    ok.publish("x/after", QoS::AtLeastOnce, false, "alive").await.expect("publish");
    assert_eq!(next_publish(&mut ok_ev).await.1, b"alive".to_vec());
    drop(extra);
    // A Last Will it could never publish (a wildcard topic) is refused at CONNECT.
    let deadline = Instant::now() + Duration::from_secs(10);
    while counters.sockets.load(Ordering::Relaxed) >= 4 {
        assert!(Instant::now() < deadline, "the idle sockets were never counted down");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (_bad, mut bad_ev) = client(b.addr, "bad-will", |o| {
        o.set_last_will(LastWill::new("x/+/status", "offline", QoS::AtLeastOnce, true));
    });
    assert!(connack(&mut bad_ev).await.is_err(), "no ConnAck for a will on a wildcard topic");
    assert_eq!(counters.malformed.load(Ordering::Relaxed), 2);
}

/// `n` idle TCP connections (the broker accepts them in the order made).
async fn idle_sockets(n: usize, addr: SocketAddr) -> Vec<tokio::net::TcpStream> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(tokio::net::TcpStream::connect(addr).await.expect("connect"));
    }
    out
}

#[tokio::test]
async fn a_subscribe_repeating_one_filter_copies_each_retained_message_once() {
    let b = start(&settings(BrokerEngine::Native)).expect("broker");
    let counters = b.counters.clone().expect("counters");
    let (publisher, mut pub_ev) = client(b.addr, "pub", |_| {});
    connack(&mut pub_ev).await.expect("connects");
    for i in 0..3 {
        publisher.publish(format!("r/{i}"), QoS::AtLeastOnce, true, "kept").await.expect("publish");
        puback(&mut pub_ev).await;
    }
    let before = counters.delivered.load(Ordering::Relaxed);
    // 5,000 copies of `#` and 5,000 of `r/+` in one SUBSCRIBE.
    let (sub, mut sub_ev) = client(b.addr, "sub", |_| {});
    connack(&mut sub_ev).await.expect("connects");
    let filters = (0..10_000)
        .map(|i| rumqttc::SubscribeFilter::new(if i % 2 == 0 { "#".into() } else { "r/+".into() }, QoS::AtLeastOnce));
    sub.subscribe_many(filters).await.expect("subscribe");
    let codes = until(&mut sub_ev, "suback", |p| match p {
        Packet::SubAck(s) => Some(s.return_codes),
        _ => None,
    })
    .await;
    assert_eq!(codes.len(), 10_000, "a code for every filter asked");
    assert!(
        codes.iter().all(|c| *c == rumqttc::SubscribeReasonCode::Success(QoS::AtLeastOnce)),
        "two distinct filters"
    );
    let mut topics = Vec::new();
    for _ in 0..3 {
        topics.push(next_publish(&mut sub_ev).await.0);
    }
    topics.sort();
    assert_eq!(topics, ["r/0", "r/1", "r/2"]);
    // A marker published after the SUBSCRIBE arrives next: no fourth copy queued before it.
    publisher.publish("r/marker", QoS::AtLeastOnce, false, "live").await.expect("publish");
    let _pub = drive(pub_ev);
    assert_eq!(next_publish(&mut sub_ev).await.0, "r/marker");
    assert_eq!(counters.delivered.load(Ordering::Relaxed) - before, 4, "three retained copies and the marker");
}

#[test]
fn a_subscriber_is_stuck_when_idle_or_full_on_a_trickle() {
    use queue::{stuck, MIN_DRAIN_BYTES};
    let stall = Duration::from_secs(20);
    let s = |idle, full, drained| stuck(Duration::from_secs(idle), Duration::from_secs(full), drained, stall);
    assert!(s(20, 0, 0), "took nothing for the stall");
    assert!(!s(19, 19, 0), "not yet");
    assert!(s(1, 20, MIN_DRAIN_BYTES - 1), "full for the stall, taking a trickle");
    assert!(!s(1, 20, MIN_DRAIN_BYTES), "full but taking a queue's worth: a busy subscriber");
    assert!(!s(1, 0, 0), "its queue had room");
}

#[test]
fn passwords_compare_whole() {
    use connect::same_secret;
    assert!(same_secret(b"secret", b"secret"));
    assert!(!same_secret(b"secret", b"secreT"));
    assert!(!same_secret(b"secret", b"secret!"), "a longer one");
    assert!(!same_secret(b"secret", b"secre"), "a prefix");
    assert!(same_secret(b"", b""));
}

/// A gatekeeper whose logins are strangers reaching `s/+`, never upgraded;
/// it counts how often it is asked anew.
#[derive(Debug, Default)]
struct NeverUpgrades {
    asked: AtomicU64,
}

impl Gatekeeper for NeverUpgrades {
    fn login(&self, _client_id: &str, login: Option<(&str, &str)>) -> Result<Grants, Refusal> {
        let (user, _) = login.ok_or(Refusal::NotAuthorized)?;
        let own = vec!["s/+".to_string()];
        let identity = format!("stranger:{user}");
        Ok(Grants { kind: LoginKind::Stranger, identity, publish: own.clone(), read: own, retain: Vec::new() })
    }

    fn regrant(&self, _current: &Grants) -> Option<Grants> {
        self.asked.fetch_add(1, Ordering::Relaxed);
        None
    }
}

#[tokio::test]
async fn a_strangers_refused_publishes_ask_the_gatekeeper_at_its_rate_not_each() {
    let gate = std::sync::Arc::new(NeverUpgrades::default());
    let b = start(&BrokerSettings { gate: Some(gate.clone()), ..settings(BrokerEngine::Native) }).expect("broker");
    let counters = b.counters.clone().expect("counters");
    let (stranger, mut ev) = client(b.addr, "stranger", |o| {
        o.set_credentials("mallory", "proof");
    });
    connack(&mut ev).await.expect("a stranger connects");
    let _driven = drive(ev);
    let started = Instant::now();
    // Retained on its own topic and anything elsewhere: refused, 2,000 times.
    for i in 0..2_000 {
        let (topic, retain) = if i % 2 == 0 { (format!("s/{i}"), true) } else { (format!("x/{i}/y"), false) };
        stranger.publish(topic, QoS::AtMostOnce, retain, "junk").await.expect("queued");
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while counters.denied.load(Ordering::Relaxed) < 2_000 {
        assert!(Instant::now() < deadline, "{} of 2,000 refused", counters.denied.load(Ordering::Relaxed));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let asked = gate.asked.load(Ordering::Relaxed);
    // Its burst of 5, then one a second.
    let allowed = 5 + started.elapsed().as_secs() + 1;
    assert!(asked <= allowed, "the gatekeeper was asked {asked} times for 2,000 refused publishes");
    assert!(counters.rate_limited.load(Ordering::Relaxed) >= 2_000 - allowed);
    assert_eq!(counters.retained.load(Ordering::Relaxed), 0, "nothing retained");
}
