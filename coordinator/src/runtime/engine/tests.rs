//! The engine core's tests: every turn is [`Core::turn`] itself, with a
//! real handshake, real sealed frames and an in-memory store; no broker.

use proptest::prelude::*;
use tunefleet_common::auth::{self, Identity, Session, UpFrame};
use tunefleet_common::measurement::{EnergyReading, EnergySourceKind, ExitOutcome, Measurement};
use tunefleet_common::message::{
    AckOutcome, AgentInfo, AgentMessage, AgentStatus, Assignment, Progress, Refusal, ResultAck, TrialRef, TrialResult,
    WorkRequest,
};

use std::time::Instant;

use tunefleet_common::message::CoordinatorMessage;
use tunefleet_common::topic::AgentTopic;

use super::*;
use crate::domain::sched::{Restored, Scheduler, StudyPolicy};
use crate::domain::search::Search;
use crate::runtime::auth::Sessions;
use crate::store::Store;

const STUDY: &str = r#"
name = "s"
command = ["true", "{x}"]
[objective]
metric = "v"
direction = "maximize"
[budget]
trials = 4
[strategy]
kind = "grid"
[hyper.x]
kind = "int"
low = 1
high = 4
"#;

/// The id the fixture's store keeps for study `s`.
const RIG_STUDY_ID: u64 = 0x5eed_0000_0000_0005;

/// Messages for agents, by agent name.
type Messages = Vec<(String, CoordinatorMessage)>;

/// How far the engine clock moves between two turns: past any lease.
const STEP_MS: u64 = 1_000_000_000_000;

/// Agent `a`, welcomed through a real handshake, and the engine's [`Core`]
/// it talks to, with a study `s` in its store. Every turn is the core's own
/// ([`Core::turn`]): a tick, with the engine clock [`STEP_MS`] on, so every
/// lease given in an earlier turn has run out and its work comes back.
struct Fixture {
    core: Core,
    agent: Option<Session>,
    /// The engine clock of the last turn.
    clock_ms: u64,
}

fn info() -> AgentInfo {
    AgentInfo { slots: 2, ..AgentInfo::minimal("a", 1) }
}

impl Fixture {
    /// A store with study `s`, and agent `a` welcomed through a real handshake.
    fn new() -> Fixture {
        Fixture::with_study(STUDY)
    }

    /// [`Fixture::new`] with another study named `s` of 4 trials, every
    /// trial made and in the store before the core starts it.
    fn with_study(text: &str) -> Fixture {
        let study = crate::domain::study::parse(text, "test.toml").expect("study");
        let mut search = Search::new(&study);
        let mut plans = Vec::new();
        while let Some(trials) = search.next_trials() {
            plans.extend(trials);
        }
        let mut store = Store::open_in_memory().expect("store");
        let mut batch = store.batch().expect("batch");
        super::open_study(&mut batch, &study, &plans).expect("create");
        batch.study_id("s", RIG_STUDY_ID).expect("study id");
        batch.commit().expect("commit");
        let mut sessions = Sessions::new(Identity::generate().expect("key").0, 9, 1);
        // The fixture's agent is admitted without a join token (tokens have tests of their own).
        sessions.open_enrolment = true;
        let coordinator_key = sessions.public_key();
        // Disturbed measurements are measured again; every stored result's points are queued.
        let core = Core::new(store, sessions)
            .with_influx(true)
            .with_offload(Some(crate::domain::offload::OffloadPolicy::default()));
        let mut fx = Fixture { core, agent: None, clock_ms: 0 };
        fx.core.start_study(study, fx.now()).expect("the study starts");
        let me = Identity::generate().expect("key").0;
        let (signed, pending) = auth::hello(&me, info(), 9, 1, [0; 32], None).expect("hello");
        let hello = UpFrame::Hello(signed);
        let out = fx.turn(vec![Inbound::Agent { agent: "a".into(), kind: AgentTopic::Hello, frame: Box::new(hello) }]);
        let (_, welcome) = out.0.into_iter().next().expect("a Welcome");
        let Ok(auth::DownFrame::Welcome(w)) = tunefleet_common::decode(&welcome) else { panic!("not a Welcome") };
        fx.agent = Some(pending.finish("a", &coordinator_key, &w).expect("session"));
        fx
    }

    /// The clocks of the fixture's turn.
    fn now(&self) -> Now {
        Now { engine_ms: self.clock_ms, unix_ms: unix_ms(), instant: Instant::now() }
    }

    /// One turn of the core with `events`: what it publishes as it is
    /// (Welcomes), and the messages it seals for agents.
    fn turn(&mut self, events: Vec<Inbound>) -> (Vec<(String, Vec<u8>)>, Messages) {
        self.turn_after(STEP_MS, events)
    }

    /// [`Fixture::turn`] with the engine clock `step_ms` on (leases given
    /// in an earlier turn still run when it is short).
    fn turn_after(&mut self, step_ms: u64, events: Vec<Inbound>) -> (Vec<(String, Vec<u8>)>, Messages) {
        self.clock_ms += step_ms;
        let out = self.core.turn(events, Vec::new(), true, self.now()).expect("a message never ends the run");
        (out.welcomes, out.messages)
    }

    /// `msg` sealed in agent `a`'s session, as the transport hands it
    /// over ([`crate::runtime::transport::classify`]: a frame too large is rejected).
    fn sealed(&mut self, msg: &AgentMessage) -> Inbound {
        let kind = AgentTopic::of_agent_message(msg);
        self.sealed_body(kind, tunefleet_common::encode(msg).expect("encode"))
    }

    /// Any `body` sealed in agent `a`'s session on a `kind` topic.
    fn sealed_body(&mut self, kind: AgentTopic, body: Vec<u8>) -> Inbound {
        let session = self.agent.as_mut().expect("welcomed");
        let frame =
            tunefleet_common::encode(&UpFrame::Sealed(session.seal(kind, body).expect("seal"))).expect("encode");
        wire(kind, &frame)
    }

    /// The scheduler and the store agree on how many trials ended how.
    fn consistent(&self) -> Result<(), String> {
        let c = self.core.sched.counts("s").ok_or("no study")?;
        let st = self.core.store.trial_counts("s").map_err(|e| e.to_string())?;
        if (c.done, c.failed, c.stopped, c.total) != (st.done, st.failed, st.stopped, st.total()) {
            return Err(format!("scheduler {c:?}, store {st:?}"));
        }
        Ok(())
    }
}

/// `payload` as agent `a` publishes it on a `kind` topic, through the transport's check.
fn wire(kind: AgentTopic, payload: &[u8]) -> Inbound {
    let topics = tunefleet_common::topic::Topics::default();
    crate::runtime::transport::classify(&topics, &topics.agent("a", kind), payload)
}

fn acks(out: &Messages) -> Vec<&ResultAck> {
    out.iter()
        .filter_map(|(_, m)| match m {
            CoordinatorMessage::Ack(a) => Some(a),
            _ => None,
        })
        .collect()
}

fn assigned(out: Messages) -> Vec<Assignment> {
    out.into_iter()
        .filter_map(|(_, m)| match m {
            CoordinatorMessage::Assign(a) => Some(a),
            _ => None,
        })
        .collect()
}

/// A result with every part a pipelined trial's has.
fn full_measurement(v: f64) -> Measurement {
    use tunefleet_common::measurement::*;
    let system = tunefleet_common::message::SystemParams { cores: Some(2), threads: Some(2), memory_mib: Some(512) };
    let mut profile = tunefleet_common::profile::Profile::empty();
    profile.values[0] = Some(1.5);
    Measurement {
        started_unix_ms: 1_700_000_000_000,
        wall_us: 2_000_000,
        user_us: 1_000_000,
        sys_us: 10_000,
        max_rss_kib: 4096,
        epochs: vec![EpochMetrics {
            epoch: 1,
            elapsed_us: 1_000_000,
            metrics: [("v".to_string(), v)].into(),
            checkpoint: Some("/ckpt/1".into()),
        }],
        final_metrics: [("v".to_string(), v)].into(),
        counters: vec![CounterReading {
            event: "task-clock".into(),
            kind: CounterKind::Software,
            value: 10,
            time_enabled_ns: 10,
            time_running_ns: 10,
        }],
        counters_missing: vec![MissingCounter { event: "cycles".into(), reason: "no PMU".into() }],
        counter_series: vec![CounterSample { elapsed_ms: 100, deltas: vec![1.0] }],
        profile: profile.clone(),
        energy: EnergyReading {
            joules: 3.0,
            domains: vec![DomainEnergy { domain: "package-0".into(), joules: 3.0, in_total: true }],
            series: vec![PowerSample { elapsed_ms: 100, watts: 1.5 }],
            interval_ms: 100,
            valid: true,
            ..EnergyReading::none(EnergySourceKind::Rapl, "rapl")
        },
        limits: AppliedLimits { cpus: vec![0, 1], threads: Some(2), memory: MemoryLimit::Cgroup { bytes: 1 << 29 } },
        log_tail: "done\n".into(),
        segments: vec![Segment {
            role: SegmentRole::Probe,
            system: system.clone(),
            cpus: vec![0, 1],
            first_epoch: 1,
            last_epoch: 1,
            steps: 0,
            start_us: 0,
            wall_us: 1_000_000,
            energy_j: Some(1.5),
            cpu_us: Some(900_000),
            unit_median_us: None,
            unit_spread: None,
            margin: None,
        }],
        selected: Some(system.clone()),
        window_profile: Some(WindowProfile { system, epochs: 1, steps: 0, wall_us: 1_000_000, profile }),
        interference: Vec::new(),
        ..Measurement::unmeasured(ExitOutcome::Exited(0), EnergyReading::none(EnergySourceKind::Rapl, ""))
    }
}

/// Mostly attempts the engine hands out (study `s` with its id, trials 0
/// to 3, first attempts), so results reach the store; sometimes any
/// (another study of the same name included).
fn trial_ref() -> impl Strategy<Value = TrialRef> {
    let study = prop_oneof![6 => Just("s".to_string()), 1 => "[a-z]{1,3}", 1 => text()];
    let id = prop_oneof![6 => Just(RIG_STUDY_ID), 1 => any::<u64>()];
    let trial = prop_oneof![6 => 0u64..4, 1 => 4u64..6, 1 => any::<u64>()];
    (study, id, trial, prop_oneof![6 => Just(1u32), 1 => 0u32..4])
        .prop_map(|(study, study_id, trial, attempt)| TrialRef { study, study_id, trial, attempt })
}

fn big() -> impl Strategy<Value = u64> {
    prop_oneof![8 => 0u64..1_000_000, 1 => Just(i64::MAX as u64), 1 => Just(9223372036854775813), 1 => any::<u64>()]
}

/// Names and texts: plain ones, any characters (control ones included),
/// option-like and log-forging ones, and long ones.
fn text() -> BoxedStrategy<String> {
    prop_oneof![
        12 => "[a-z0-9._/-]{0,12}",
        2 => ".{0,24}",
        1 => Just("--output=/home/victim/.bashrc".to_string()),
        1 => Just("ok\n\u{1b}[31mFORGED LOG LINE".to_string()),
        1 => (0usize..3000).prop_map(|n| "x".repeat(n)),
    ]
    .boxed()
}

fn float() -> BoxedStrategy<f64> {
    prop_oneof![
        8 => -1e6f64..1e6,
        1 => Just(f64::NAN),
        1 => Just(f64::INFINITY),
        1 => Just(f64::NEG_INFINITY),
        1 => any::<f64>(),
    ]
    .boxed()
}

/// A few of `item`, now and then `huge` of them (within the frame size limit).
fn some<T: Clone + std::fmt::Debug + 'static>(item: BoxedStrategy<T>, huge: usize) -> BoxedStrategy<Vec<T>> {
    some_of(item.clone(), item, huge)
}

/// A few of `item`, now and then `huge` of `small` (a small kind of
/// item, so a huge list stays within the frame size limit).
fn some_of<T: Clone + std::fmt::Debug + 'static>(
    item: BoxedStrategy<T>,
    small: BoxedStrategy<T>,
    huge: usize,
) -> BoxedStrategy<Vec<T>> {
    prop_oneof![30 => prop::collection::vec(item, 0..3), 1 => small.prop_map(move |x| vec![x; huge])].boxed()
}

fn metrics() -> BoxedStrategy<tunefleet_common::measurement::Metrics> {
    let name = prop_oneof![4 => Just("v".to_string()), 2 => Just("loss".to_string()), 2 => text()];
    prop_oneof![
        30 => prop::collection::btree_map(name, float(), 0..3),
        1 => prop::collection::btree_map("[a-z]{6,8}", float(), 250..300),
    ]
    .boxed()
}

fn system() -> BoxedStrategy<tunefleet_common::message::SystemParams> {
    (prop::option::of(any::<u32>()), prop::option::of(any::<u32>()), prop::option::of(big()))
        .prop_map(|(cores, threads, memory_mib)| tunefleet_common::message::SystemParams { cores, threads, memory_mib })
        .boxed()
}

fn profile() -> BoxedStrategy<tunefleet_common::profile::Profile> {
    let values = some(prop::option::of(float()).boxed(), 100);
    (prop_oneof![Just(tunefleet_common::profile::PROFILE_VERSION), any::<u16>()], values)
        .prop_map(|(version, values)| tunefleet_common::profile::Profile { version, values })
        .boxed()
}

fn window_profile() -> BoxedStrategy<tunefleet_common::measurement::WindowProfile> {
    (system(), any::<u32>(), any::<u32>(), big(), profile())
        .prop_map(|(system, epochs, steps, wall_us, profile)| tunefleet_common::measurement::WindowProfile {
            system,
            epochs,
            steps,
            wall_us,
            profile,
        })
        .boxed()
}

/// A segment whose CPU list may be `cpus` long.
fn segment(cpus: usize) -> BoxedStrategy<tunefleet_common::measurement::Segment> {
    use tunefleet_common::measurement::{Segment, SegmentRole};
    let role = prop::sample::select(vec![
        SegmentRole::Warmup,
        SegmentRole::Probe,
        SegmentRole::Selected,
        SegmentRole::Reconfigured,
        SegmentRole::Initial,
        SegmentRole::Reused,
        SegmentRole::Cut,
    ]);
    let spans =
        (any::<u32>(), any::<u32>(), any::<u32>(), big(), big(), prop::option::of(float()), prop::option::of(big()));
    (role, system(), some(any::<u32>().boxed(), cpus), spans)
        .prop_map(|(role, system, cpus, (first_epoch, last_epoch, steps, start_us, wall_us, energy_j, cpu_us))| {
            Segment {
                role,
                system,
                cpus,
                first_epoch,
                last_epoch,
                steps,
                start_us,
                wall_us,
                energy_j,
                cpu_us,
                unit_median_us: None,
                unit_spread: None,
                margin: None,
            }
        })
        .boxed()
}

fn energy() -> BoxedStrategy<EnergyReading> {
    use tunefleet_common::measurement::{DomainEnergy, PowerSample};
    let kind = prop::sample::select(vec![
        EnergySourceKind::Rapl,
        EnergySourceKind::Hwmon,
        EnergySourceKind::Battery,
        EnergySourceKind::Estimated,
        EnergySourceKind::External,
    ]);
    let domain = (text(), float(), any::<bool>())
        .prop_map(|(domain, joules, in_total)| DomainEnergy { domain, joules, in_total })
        .boxed();
    let sample = (big(), float()).prop_map(|(elapsed_ms, watts)| PowerSample { elapsed_ms, watts }).boxed();
    (kind, float(), some(domain, 100), any::<u32>(), any::<bool>(), prop::option::of(text()), some(sample, 600))
        .prop_map(|(source, joules, domains, interval_ms, valid, note, series)| EnergyReading {
            source,
            joules,
            domains,
            interval_ms,
            valid,
            note,
            series,
        })
        .boxed()
}

/// GPU readings: indexes from a few (some listed twice), any joules,
/// now and then too many.
fn gpus() -> BoxedStrategy<Vec<tunefleet_common::measurement::GpuEnergy>> {
    use tunefleet_common::measurement::{GpuEnergy, GpuMethod};
    let gpu = (0u32..4, text(), float(), any::<bool>(), any::<bool>(), prop::option::of(text()))
        .prop_map(|(index, uuid, joules, counter, valid, note)| GpuEnergy {
            index,
            uuid,
            joules,
            method: if counter { GpuMethod::Counter } else { GpuMethod::PowerIntegrated },
            valid,
            note,
        })
        .boxed();
    some(gpu, 70)
}

fn measurement() -> BoxedStrategy<Measurement> {
    use tunefleet_common::measurement::*;
    let exit = prop_oneof![
        4 => any::<i32>().prop_map(ExitOutcome::Exited),
        4 => Just(ExitOutcome::Exited(0)),
        1 => any::<i32>().prop_map(ExitOutcome::Signaled),
        1 => Just(ExitOutcome::TimedOut),
        1 => Just(ExitOutcome::Cancelled),
        1 => text().prop_map(ExitOutcome::SpawnFailed),
    ];
    let epoch = (any::<u32>(), big(), metrics(), prop::option::of(text()))
        .prop_map(|(epoch, elapsed_us, metrics, checkpoint)| EpochMetrics { epoch, elapsed_us, metrics, checkpoint })
        .boxed();
    let plain_epoch = (any::<u32>(), big())
        .prop_map(|(epoch, elapsed_us)| EpochMetrics { epoch, elapsed_us, metrics: Metrics::new(), checkpoint: None })
        .boxed();
    let kind = prop_oneof![Just(CounterKind::Hardware), Just(CounterKind::Software)];
    let counter = (text(), kind, big(), big(), big())
        .prop_map(|(event, kind, value, time_enabled_ns, time_running_ns)| CounterReading {
            event,
            kind,
            value,
            time_enabled_ns,
            time_running_ns,
        })
        .boxed();
    let missing = (text(), text()).prop_map(|(event, reason)| MissingCounter { event, reason }).boxed();
    let sample =
        (big(), some(float(), 70)).prop_map(|(elapsed_ms, deltas)| CounterSample { elapsed_ms, deltas }).boxed();
    let memory = prop_oneof![
        Just(MemoryLimit::None),
        big().prop_map(|bytes| MemoryLimit::Cgroup { bytes }),
        big().prop_map(|bytes| MemoryLimit::Rlimit { bytes }),
    ];
    let limits = (some(any::<u32>().boxed(), 70_000), prop::option::of(any::<u32>()), memory)
        .prop_map(|(cpus, threads, memory)| AppliedLimits { cpus, threads, memory });
    let times = (big(), big(), big(), big(), big());
    let series =
        (some_of(epoch, plain_epoch, 5000), metrics(), some(counter, 100), some(missing, 100), some(sample, 600));
    let rest = (
        profile(),
        energy(),
        limits,
        prop_oneof![30 => text(), 1 => Just("y".repeat(20_000))],
        some_of(segment(70_000), segment(2), 1100),
        prop::option::of(system()),
        prop::option::of(window_profile()),
        // Mostly clean: a disturbed measurement is measured again, not stored.
        prop_oneof![6 => Just(Vec::new()), 1 => some(text(), 20)],
        gpus(),
    );
    (times, exit, series, rest)
        .prop_map(
            |(
                (started_unix_ms, wall_us, user_us, sys_us, max_rss_kib),
                exit,
                (epochs, final_metrics, counters, counters_missing, counter_series),
                (profile, energy, limits, log_tail, segments, selected, window_profile, interference, gpus),
            )| Measurement {
                started_unix_ms,
                wall_us,
                user_us,
                sys_us,
                max_rss_kib,
                exit,
                epochs,
                final_metrics,
                counters,
                counters_missing,
                counter_series,
                profile,
                energy,
                limits,
                log_tail,
                segments,
                selected,
                window_profile,
                interference,
                gpus,
                cpu_share: None,
            },
        )
        .boxed()
}

fn telemetry() -> BoxedStrategy<tunefleet_common::measurement::Telemetry> {
    use tunefleet_common::measurement::{Conditions, Telemetry};
    let conditions = (
        prop::option::of(any::<bool>()),
        prop::option::of(float()),
        prop::option::of(any::<bool>()),
        prop::option::of(float()),
    )
        .prop_map(|(charging, battery_percent, throttled, temperature_c)| Conditions {
            charging,
            battery_percent,
            throttled,
            temperature_c,
        });
    let load = (float(), some(float(), 70_000), big(), big(), prop::option::of(float()));
    (big(), any::<u32>(), load, any::<u32>(), prop::option::of(float()), conditions)
        .prop_map(
            |(
                unix_ms,
                interval_ms,
                (cpu_utilisation, per_cpu, memory_used_bytes, memory_total_bytes, power_watts),
                running,
                foreign_cpu,
                conditions,
            )| {
                Telemetry {
                    unix_ms,
                    interval_ms,
                    cpu_utilisation,
                    per_cpu,
                    memory_used_bytes,
                    memory_total_bytes,
                    power_watts,
                    power_source: EnergySourceKind::Estimated,
                    running,
                    foreign_cpu,
                    conditions,
                }
            },
        )
        .boxed()
}

/// A good measurement with one field (any, nested ones whole) taken
/// from a random one: a single bad value, so results with it reach the
/// scheduler and the store unless validation stops them.
fn spliced() -> BoxedStrategy<Measurement> {
    let field = prop_oneof![3 => 0usize..19, 1 => Just(19)];
    let past = prop_oneof![Just(i64::MAX as u64 + 1), Just(9223372036854775813), Just(u64::MAX)];
    let not_finite = prop_oneof![Just(f64::NAN), Just(f64::INFINITY), Just(f64::NEG_INFINITY)];
    (measurement(), field, -1e3f64..1e3, (segment(4), 0usize..10, past, not_finite))
        .prop_map(|(r, field, v, (rs, sub, past, not_finite))| {
            let mut m = full_measurement(v);
            match field {
                // One field of a good segment, its numbers out of range
                // (a crash found by an attack: a segment past i64::MAX).
                19 => {
                    let s = &mut m.segments[0];
                    match sub {
                        0 => s.role = rs.role,
                        1 => s.system = rs.system,
                        2 => s.cpus = rs.cpus,
                        3 => s.first_epoch = rs.first_epoch,
                        4 => s.last_epoch = rs.last_epoch,
                        5 => s.steps = rs.steps,
                        6 => s.start_us = past,
                        7 => s.wall_us = past,
                        8 => s.energy_j = Some(not_finite),
                        _ => s.cpu_us = Some(past),
                    }
                }
                0 => m.started_unix_ms = r.started_unix_ms,
                1 => m.wall_us = r.wall_us,
                2 => m.user_us = r.user_us,
                3 => m.sys_us = r.sys_us,
                4 => m.max_rss_kib = r.max_rss_kib,
                5 => m.exit = r.exit,
                6 => m.epochs = r.epochs,
                7 => m.final_metrics = r.final_metrics,
                8 => m.counters = r.counters,
                9 => m.counters_missing = r.counters_missing,
                10 => m.counter_series = r.counter_series,
                11 => m.profile = r.profile,
                12 => m.energy = r.energy,
                13 => m.limits = r.limits,
                14 => m.log_tail = r.log_tail,
                15 => m.segments = r.segments,
                16 => m.selected = r.selected,
                17 => m.window_profile = r.window_profile,
                18 => m.interference = r.interference,
                _ => {}
            }
            m
        })
        .boxed()
}

/// Every message an agent sends, every field of it, nested ones included,
/// alone or bundled with others.
fn message() -> impl Strategy<Value = AgentMessage> {
    let single = single_message();
    let bundleable = single.clone().prop_filter("a status is never bundled", AgentMessage::bundleable);
    prop_oneof![
        8 => single,
        1 => prop::collection::vec(bundleable, 2..4).prop_map(|msgs| AgentMessage::bundle(&msgs).expect("bundles")),
    ]
}

fn single_message() -> BoxedStrategy<AgentMessage> {
    let checkpoint = prop::option::of(prop_oneof![3 => "/ckpt/[a-z0-9]{1,4}", 1 => text()]);
    prop_oneof![
        2 => (trial_ref(), measurement())
            .prop_map(|(trial, measurement)| AgentMessage::Result(TrialResult { trial, measurement })),
        4 => (trial_ref(), spliced())
            .prop_map(|(trial, measurement)| AgentMessage::Result(TrialResult { trial, measurement })),
        3 => (trial_ref(), any::<u32>(), big(), metrics(), checkpoint, prop::option::of(window_profile())).prop_map(
            |(trial, epoch, elapsed_us, metrics, checkpoint, profile)| AgentMessage::Progress(Progress {
                trial,
                epoch,
                elapsed_us,
                metrics,
                checkpoint,
                profile,
            })
        ),
        3 => (any::<u64>(), prop_oneof![0u32..4, any::<u32>()], some(trial_ref().boxed(), 2100))
            .prop_map(|(seq, free, running)| AgentMessage::Request(WorkRequest { seq, free, ahead: 0, running, held: vec![] })),
        1 => (trial_ref(), text()).prop_map(|(trial, reason)| AgentMessage::Refuse(Refusal { trial, reason })),
        1 => telemetry().prop_map(AgentMessage::Telemetry),
        1 => (any::<bool>(), any::<u64>())
            .prop_map(|(online, instance)| AgentMessage::Status(AgentStatus { online, instance })),
        1 => any::<u64>().prop_map(AgentMessage::Synced),
        1 => (trial_ref(), big(), big(), energy(), big(), any::<u32>(), big(), gpus()).prop_map(
            |(trial, from_unix_ms, to_unix_ms, energy, cpu_us, cpus, covered_ms, gpus)| {
                AgentMessage::CoMeasured(tunefleet_common::message::CoMeasured {
                    trial, from_unix_ms, to_unix_ms, energy, cpu_us, cpus, covered_ms, gpus,
                })
            }
        ),
    ]
    .boxed()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Authenticated messages of every kind with any values in every
    /// field (out of range, not finite, too long, too many, control
    /// characters, for studies and attempts that do not exist, in any
    /// order) never stop the engine; every result that reaches it is
    /// answered, and the scheduler and the store agree after each turn.
    #[test]
    fn any_authenticated_message_leaves_the_coordinator_running(msgs in prop::collection::vec(message(), 1..16)) {
        let mut fx = Fixture::new();
        let mut results = 0;
        let mut acks = 0;
        let mut online = true;
        // One message a turn, so work handed out in one turn can be answered in the next.
        for m in &msgs {
            let ev = fx.sealed(m);
            // An offline status ends the session: what follows is refused
            // unanswered; a frame too large never reaches the engine.
            if online && matches!(ev, Inbound::Agent { .. }) {
                let inner = m.clone().unbundle().unwrap_or_default();
                results += inner.iter().filter(|m| matches!(m, AgentMessage::Result(_))).count();
            }
            online &= !matches!(m, AgentMessage::Status(s) if !s.online);
            let (_, out) = fx.turn(vec![ev]);
            acks += acks_in(&out);
            prop_assert_eq!(fx.consistent(), Ok(()));
        }
        prop_assert_eq!(acks, results, "every result gets an answer the agent acts on");
        prop_assert_eq!(fx.core.stats.store_errors, 0, "validation keeps every value the store cannot take out");
        // The store still answers.
        prop_assert_eq!(fx.core.store.trials("s").expect("trials").len(), 4);
    }
}

fn acks_in(out: &Messages) -> usize {
    acks(out).len()
}

fn ok_measurement(v: f64) -> Measurement {
    Measurement {
        wall_us: 5,
        final_metrics: [("v".to_string(), v)].into(),
        ..Measurement::unmeasured(ExitOutcome::Exited(0), EnergyReading::none(EnergySourceKind::Estimated, ""))
    }
}

/// What the fixture's agent is answered for a result of `trial`.
fn answer(fx: &mut Fixture, trial: &TrialRef, v: f64) -> AckOutcome {
    let msg = fx.sealed(&AgentMessage::Result(TrialResult { trial: trial.clone(), measurement: ok_measurement(v) }));
    let (_, out) = fx.turn(vec![msg]);
    match acks(&out)[..] {
        [ack] if ack.trial == *trial => ack.outcome.clone(),
        ref other => panic!("one answer for {trial} expected: {other:?}"),
    }
}

/// References of another study of the same name
/// (another study id: another store) are none of this study's. Its
/// result is refused (the agent parks it; never `Duplicate`, which the
/// agent deletes), its progress and refusal are ignored, and it never
/// takes this study's trial.
#[test]
fn regression_another_study_of_the_same_name_is_refused_never_duplicate() {
    let mut fx = Fixture::new();
    let req =
        fx.sealed(&AgentMessage::Request(WorkRequest { seq: 1, free: 1, ahead: 0, running: vec![], held: vec![] }));
    let a = assigned(fx.turn(vec![req]).1).pop().expect("work");
    assert_eq!(a.trial.study_id, RIG_STUDY_ID, "an assignment carries the study's id");
    let twin = TrialRef { study_id: RIG_STUDY_ID ^ 1, ..a.trial.clone() };
    let progress = Progress {
        trial: twin.clone(),
        epoch: 1,
        elapsed_us: 1,
        metrics: [("v".to_string(), 1.0)].into(),
        checkpoint: None,
        profile: None,
    };
    let refusal = Refusal { trial: twin.clone(), reason: "busy".into() };
    let twin_result = TrialResult { trial: twin.clone(), measurement: ok_measurement(9.0) };
    let own_result = TrialResult { trial: a.trial.clone(), measurement: ok_measurement(1.0) };
    // One turn, while the trial runs: the twin's progress, refusal and
    // result, then the study's own result.
    let events = vec![
        fx.sealed(&AgentMessage::Progress(progress)),
        fx.sealed(&AgentMessage::Refuse(refusal)),
        fx.sealed(&AgentMessage::Result(twin_result)),
        fx.sealed(&AgentMessage::Result(own_result)),
    ];
    let (_, out) = fx.turn(events);
    let answers: Vec<(&TrialRef, &AckOutcome)> = acks(&out).into_iter().map(|a| (&a.trial, &a.outcome)).collect();
    assert!(
        matches!(&answers[..], [(t, AckOutcome::Refused(why)), (own, AckOutcome::Stored)]
            if **t == twin && **own == a.trial && why.contains("another study of that name")),
        "{answers:?}"
    );
    assert_eq!(out.len(), 2, "nothing else: {out:?}");
    assert_eq!(fx.core.stats.requeued, 0, "the twin's refusal requeued nothing");
    assert!(fx.core.store.progress(&a.trial).expect("progress").is_empty(), "the twin's epoch is not kept");
    // Once the trial is finished: still refused, never a duplicate.
    let outcome = answer(&mut fx, &twin, 9.0);
    assert!(matches!(&outcome, AckOutcome::Refused(why) if why.contains("another study of that name")), "{outcome:?}");
    assert_eq!(answer(&mut fx, &a.trial, 1.0), AckOutcome::Duplicate, "its own attempt is");
    assert_eq!(fx.core.stats.other_study_refs, 4);
    let results = fx.core.store.results("s").expect("results");
    assert_eq!(results.iter().map(|r| r.objective()).collect::<Vec<_>>(), [Some(1.0)], "this study's result alone");
    assert_eq!(fx.consistent(), Ok(()));
}

/// A coordinator restarted on its store knows no attempt history but
/// the store's: a result of an attempt an earlier process gave is still
/// a duplicate; one never given is refused, not acknowledged.
#[test]
fn after_a_restart_duplicate_only_for_an_attempt_the_store_knows() {
    let mut fx = Fixture::new();
    let req =
        fx.sealed(&AgentMessage::Request(WorkRequest { seq: 1, free: 1, ahead: 0, running: vec![], held: vec![] }));
    let a = assigned(fx.turn(vec![req]).1).pop().expect("work");
    assert_eq!(answer(&mut fx, &a.trial, 1.0), AckOutcome::Stored);
    // The restart: the scheduler as `start_study` rebuilds it from the store.
    let policy = StudyPolicy {
        name: "s".into(),
        id: RIG_STUDY_ID,
        selector: Default::default(),
        max_attempts: 3,
        ahead_per_slot: tunefleet_common::message::MAX_LOOKAHEAD_PER_SLOT,
        ahead_per_agent: None,
        lease_ms: 60_000,
        gpus: 0,
        store_share: u64::MAX,
    };
    let mut states = vec![Restored::Pending { last_attempt: 0, failures: 0 }; 4];
    states[a.trial.trial as usize] = Restored::Done;
    fx.core.sched = Scheduler::new();
    fx.core.sched.add_study(policy, states, 0);
    assert_eq!(answer(&mut fx, &a.trial, 1.0), AckOutcome::Duplicate, "the store knows the attempt");
    let never = TrialRef { attempt: a.trial.attempt + 1, ..a.trial.clone() };
    let outcome = answer(&mut fx, &never, 2.0);
    assert!(matches!(&outcome, AckOutcome::Refused(why) if why.contains("never gave")), "{outcome:?}");
    let twin = TrialRef { study_id: 1, ..a.trial.clone() };
    let outcome = answer(&mut fx, &twin, 3.0);
    assert!(matches!(&outcome, AckOutcome::Refused(why) if why.contains("another study")), "{outcome:?}");
    assert_eq!(fx.core.store.results("s").expect("results").len(), 1);
    assert_eq!(
        (fx.core.stats.duplicate_results, fx.core.stats.unknown_results, fx.core.stats.other_study_refs),
        (1, 1, 1)
    );
}

#[test]
fn a_result_that_cannot_be_stored_is_refused_and_the_study_goes_on() {
    let mut fx = Fixture::new();
    let req =
        fx.sealed(&AgentMessage::Request(WorkRequest { seq: 1, free: 1, ahead: 0, running: vec![], held: vec![] }));
    let (_, out) = fx.turn(vec![req]);
    let Some(CoordinatorMessage::Assign(a)) = out.into_iter().map(|(_, m)| m).next() else { panic!("no work") };
    let huge = Measurement {
        wall_us: u64::MAX,
        ..Measurement::unmeasured(ExitOutcome::Exited(0), EnergyReading::none(EnergySourceKind::Estimated, ""))
    };
    let bad = fx.sealed(&AgentMessage::Result(TrialResult { trial: a.trial.clone(), measurement: huge }));
    let (_, out) = fx.turn(vec![bad]);
    let answer = out.into_iter().find_map(|(_, m)| match m {
        CoordinatorMessage::Ack(ack) => Some(ack),
        _ => None,
    });
    let answer = answer.expect("answered");
    assert!(matches!(&answer.outcome, AckOutcome::Refused(why) if why.contains("wall_us")), "{answer:?}");
    assert_eq!(fx.core.stats.invalid_messages, 1);
    // A good result for the same attempt is still taken.
    let good = Measurement {
        wall_us: 5,
        final_metrics: [("v".to_string(), 1.0)].into(),
        ..Measurement::unmeasured(ExitOutcome::Exited(0), EnergyReading::none(EnergySourceKind::Estimated, ""))
    };
    let ok = fx.sealed(&AgentMessage::Result(TrialResult { trial: a.trial, measurement: good }));
    let (_, out) = fx.turn(vec![ok]);
    assert!(out
        .iter()
        .any(|(_, m)| matches!(m, CoordinatorMessage::Ack(ResultAck { outcome: AckOutcome::Stored, .. }))));
    assert_eq!(fx.core.sched.counts("s").expect("study").done, 1);
}

/// What the fixture's agent is given for its request `seq` of one free slot.
fn one_slot_free(fx: &mut Fixture, seq: u64) -> Vec<Assignment> {
    slots_free(fx, seq, 1)
}

/// The agent's request `seq` with `free` slots free: the work it is given.
fn slots_free(fx: &mut Fixture, seq: u64, free: u32) -> Vec<Assignment> {
    let request = WorkRequest { seq, free, ahead: 0, running: vec![], held: vec![] };
    let msg = fx.sealed(&AgentMessage::Request(request));
    assigned(fx.turn(vec![msg]).1)
}

/// A result is one GPU reading per GPU its trial was given (the agent
/// assembles it so): one of a CPU trial that says it measured a GPU is not
/// believed, and the trial runs again; the honest one after it completes.
#[test]
fn a_result_with_readings_of_gpus_its_trial_was_not_given_is_run_again() {
    use tunefleet_common::measurement::{GpuEnergy, GpuMethod};
    let mut fx = Fixture::new();
    let a = one_slot_free(&mut fx, 1).into_iter().next().expect("work");
    let gpu =
        GpuEnergy { index: 0, uuid: "GPU-0".into(), joules: 9.0, method: GpuMethod::Counter, valid: true, note: None };
    let forged = Measurement { gpus: vec![gpu], ..ok_measurement(1.0) };
    let msg = fx.sealed(&AgentMessage::Result(TrialResult { trial: a.trial.clone(), measurement: forged }));
    fx.turn(vec![msg]);
    let counts = fx.core.sched.counts("s").expect("study");
    assert_eq!((counts.done, counts.failed), (0, 0), "not taken, not failed: run again");
    let again = one_slot_free(&mut fx, 2);
    assert!(again.iter().any(|b| b.trial.trial == a.trial.trial && b.trial.attempt > a.trial.attempt), "{again:?}");
    let retried = again.iter().find(|b| b.trial.trial == a.trial.trial).expect("retried").trial.clone();
    assert_eq!(answer(&mut fx, &retried, 1.0), AckOutcome::Stored);
    assert_eq!(fx.core.sched.counts("s").expect("study").done, 1);
}

/// A result not believed (GPU readings of a CPU trial) of an attempt its
/// trial moved on from (the lease ran out, the trial queued again) was
/// kept as the trial's result: the store made it done while the scheduler
/// left it queued (found by `any_authenticated_message_...`). It ends its
/// attempt, as a result of an attempt cancelled or never started does.
#[test]
fn regression_a_result_not_believed_of_an_attempt_moved_on_from_completes_nothing() {
    use tunefleet_common::measurement::{GpuEnergy, GpuMethod};
    let mut fx = Fixture::new();
    let a = one_slot_free(&mut fx, 1).into_iter().next().expect("work");
    // The fixture's clock passes the lease: the trial is queued again.
    fx.turn(vec![]);
    let gpu =
        GpuEnergy { index: 0, uuid: "GPU-0".into(), joules: 9.0, method: GpuMethod::Counter, valid: true, note: None };
    let forged = Measurement { gpus: vec![gpu], ..ok_measurement(1.0) };
    let msg = fx.sealed(&AgentMessage::Result(TrialResult { trial: a.trial.clone(), measurement: forged }));
    let (_, out) = fx.turn(vec![msg]);
    assert_eq!(fx.consistent(), Ok(()));
    assert_eq!(fx.core.store.trial_counts("s").expect("counts").done, 0, "no result of the trial");
    assert!(fx.core.store.results("s").expect("results").is_empty());
    assert_eq!(
        acks(&out).iter().map(|a| a.outcome.clone()).collect::<Vec<_>>(),
        [AckOutcome::Stored],
        "the attempt ended"
    );
    assert_eq!(fx.core.stats.superseded_results, 1);
}

/// A segment starting past i64::MAX left
/// `engine::turn` with a store error and ended the process; nothing was
/// acknowledged, so the agent sent it again after every restart.
#[test]
fn regression_a_segment_past_i64_is_refused_and_the_study_goes_on() {
    let mut fx = Fixture::new();
    let req =
        fx.sealed(&AgentMessage::Request(WorkRequest { seq: 1, free: 1, ahead: 0, running: vec![], held: vec![] }));
    let (_, out) = fx.turn(vec![req]);
    let a = assigned(out).pop().expect("work");
    let mut m = full_measurement(1.0);
    m.segments[0].start_us = 9223372036854775813;
    let bad = fx.sealed(&AgentMessage::Result(TrialResult { trial: a.trial.clone(), measurement: m }));
    let (_, out) = fx.turn(vec![bad]);
    let ack = acks(&out).pop().cloned().expect("answered");
    assert!(
        matches!(&ack.outcome, AckOutcome::Refused(why) if why.contains("measurement.segments[0].start_us")),
        "{ack:?}"
    );
    assert_eq!(
        (fx.core.stats.invalid_messages, fx.core.stats.store_errors),
        (1, 0),
        "refused by validation, before the store"
    );
    // The attempt still runs: its good result is taken, and the study goes on.
    let ok = fx.sealed(&AgentMessage::Result(TrialResult { trial: a.trial, measurement: full_measurement(2.0) }));
    let (_, out) = fx.turn(vec![ok]);
    assert_eq!(acks(&out).pop().map(|a| a.outcome.clone()), Some(AckOutcome::Stored));
    assert_eq!(fx.core.sched.counts("s").expect("study").done, 1);
    assert_eq!(fx.consistent(), Ok(()));
    let req =
        fx.sealed(&AgentMessage::Request(WorkRequest { seq: 2, free: 1, ahead: 0, running: vec![], held: vec![] }));
    assert_eq!(assigned(fx.turn(vec![req]).1).len(), 1, "more work is handed out");
}

/// A store error while handling one message undoes that message alone:
/// the other messages of the turn are kept, the result is answered
/// Refused (the agent parks it), and the scheduler is left as the store
/// has it, so the same result is taken once the store takes it.
#[test]
fn a_store_error_rolls_back_its_message_alone() {
    let mut fx = Fixture::new();
    let work = slots_free(&mut fx, 1, 2);
    assert_eq!(work.len(), 2);
    let (t0, t1) = (work[0].trial.clone(), work[1].trial.clone());
    fx.core
        .store
        .execute_for_test(&format!(
            "CREATE TRIGGER planted BEFORE INSERT ON results WHEN NEW.trial = {}
             BEGIN SELECT RAISE(ABORT, 'planted failure'); END;",
            t0.trial
        ))
        .expect("trigger");
    let result = |trial: &TrialRef| {
        AgentMessage::Result(TrialResult { trial: trial.clone(), measurement: full_measurement(1.0) })
    };
    let progress = AgentMessage::Progress(Progress {
        trial: t1.clone(),
        epoch: 1,
        elapsed_us: 5,
        metrics: [("v".to_string(), 0.5)].into(),
        checkpoint: None,
        profile: None,
    });
    let events = vec![fx.sealed(&progress), fx.sealed(&result(&t0)), fx.sealed(&result(&t1))];
    let (_, out) = fx.turn(events);
    let answers: Vec<(u64, AckOutcome)> = acks(&out).into_iter().map(|a| (a.trial.trial, a.outcome.clone())).collect();
    assert!(
        matches!(&answers[..], [(a, AckOutcome::Refused(why)), (b, AckOutcome::Stored)]
            if *a == t0.trial && *b == t1.trial && why.contains("planted failure")),
        "{answers:?}"
    );
    assert_eq!(fx.core.stats.store_errors, 1);
    assert_eq!(fx.core.store.progress(&t1).expect("progress").len(), 1, "the turn's other messages are kept");
    assert_eq!(fx.core.sched.counts("s").expect("study").done, 1, "the refused result is not counted");
    assert_eq!(fx.consistent(), Ok(()));
    // The store takes it again: the same result is stored, not a duplicate.
    fx.core.store.execute_for_test("DROP TRIGGER planted").expect("drop");
    let again = fx.sealed(&result(&t0));
    let (_, out) = fx.turn(vec![again]);
    assert_eq!(acks(&out).pop().map(|a| a.outcome.clone()), Some(AckOutcome::Stored));
    assert_eq!(fx.core.sched.counts("s").expect("study").done, 2);
    assert_eq!(fx.consistent(), Ok(()));
}

/// A study that resumes from checkpoints under `s3://bucket/ckpt/`, and
/// its first trial assigned to the fixture's agent.
fn resumable_trial_running() -> (Fixture, Assignment) {
    let study = STUDY.replace(
        "[objective]",
        "resume = [\"--resume\", \"{checkpoint}\"]\nresume_prefix = \"s3://bucket/ckpt/\"\n[objective]",
    );
    let mut fx = Fixture::with_study(&study);
    let req =
        fx.sealed(&AgentMessage::Request(WorkRequest { seq: 1, free: 1, ahead: 0, running: vec![], held: vec![] }));
    let a = assigned(fx.turn(vec![req]).1).pop().expect("work");
    (fx, a)
}

/// A checkpoint became options of another agent's
/// command. Checkpoints outside `resume_prefix` are not kept, malformed
/// ones are refused with their message, and a kept one is one argument.
#[test]
fn regression_checkpoints_stay_under_their_prefix_and_one_argument() {
    let (mut fx, a) = resumable_trial_running();
    let progress = |epoch: u32, checkpoint: &str| {
        AgentMessage::Progress(Progress {
            trial: a.trial.clone(),
            epoch,
            elapsed_us: 5,
            metrics: Default::default(),
            checkpoint: Some(checkpoint.into()),
            profile: None,
        })
    };
    let events = vec![
        fx.sealed(&progress(1, "s3://bucket/ckpt/t0 e1")),
        fx.sealed(&progress(2, "/home/victim/.bashrc")),
        fx.sealed(&progress(3, "s3://bucket/ckpt/../../victim")),
        fx.sealed(&progress(4, "--output=/home/victim/.bashrc\n\u{1b}[31mFORGED")),
    ];
    fx.turn(events);
    assert_eq!(fx.core.stats.refused_checkpoints, 2, "outside the prefix: refused, not kept");
    assert_eq!(fx.core.stats.invalid_messages, 1, "an option with control characters: the message is refused");
    let stored: Vec<Option<String>> =
        fx.core.store.study_progress("s").expect("progress").into_iter().map(|p| p.checkpoint).collect();
    assert_eq!(stored, vec![Some("s3://bucket/ckpt/t0 e1".to_string()), None, None]);
    // The agent gives the trial back: the next attempt resumes from the one kept checkpoint.
    let refuse = fx.sealed(&AgentMessage::Refuse(Refusal { trial: a.trial.clone(), reason: "draining".into() }));
    fx.turn(vec![refuse]);
    let req =
        fx.sealed(&AgentMessage::Request(WorkRequest { seq: 2, free: 1, ahead: 0, running: vec![], held: vec![] }));
    let next = assigned(fx.turn(vec![req]).1).pop().expect("work again");
    assert_eq!(next.trial.trial, a.trial.trial);
    let argv = &next.spec.argv;
    assert_eq!(&argv[argv.len() - 2..], ["--resume", "s3://bucket/ckpt/t0 e1"], "{argv:?}");
}

/// Stable-toolchain fuzzing (the `fuzz/` target needs nightly): seeded
/// random frames, and mutations of real frames sealed in a real session
/// (bytes flipped, inserted, deleted, cut; both the frame on the wire
/// and the body under a valid MAC), go through the transport's check and
/// the engine's own decode, open, validate and handle path, several a
/// turn. Nothing panics, the engine keeps going, the scheduler and the
/// store agree. Runs 3 s; `TUNEFLEET_FUZZ_SECS` for longer,
/// `TUNEFLEET_FUZZ_SEED` for another seed.
#[test]
fn random_and_mutated_frames_never_stop_the_engine() {
    use rand::{Rng, SeedableRng};
    let secs: f64 = std::env::var("TUNEFLEET_FUZZ_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(3.0);
    let seed: u64 = std::env::var("TUNEFLEET_FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(20);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut fx = Fixture::new();
    let req =
        fx.sealed(&AgentMessage::Request(WorkRequest { seq: 1, free: 2, ahead: 0, running: vec![], held: vec![] }));
    let work = assigned(fx.turn(vec![req]).1);
    let live = work.first().map(|w| w.trial.clone()).expect("work");
    let seeds: Vec<AgentMessage> = vec![
        AgentMessage::Request(WorkRequest { seq: 2, free: 1, ahead: 0, running: vec![live.clone()], held: vec![] }),
        AgentMessage::Progress(Progress {
            trial: live.clone(),
            epoch: 1,
            elapsed_us: 5,
            metrics: [("v".to_string(), 0.5)].into(),
            checkpoint: Some("/ckpt/1".into()),
            profile: full_measurement(1.0).window_profile,
        }),
        AgentMessage::Result(TrialResult { trial: live.clone(), measurement: full_measurement(1.0) }),
        AgentMessage::Refuse(Refusal { trial: live, reason: "busy".into() }),
        AgentMessage::Telemetry(tunefleet_common::measurement::Telemetry {
            unix_ms: 1,
            interval_ms: 1000,
            cpu_utilisation: 0.5,
            per_cpu: vec![0.5, 0.25],
            memory_used_bytes: 1 << 30,
            memory_total_bytes: 1 << 32,
            power_watts: Some(12.0),
            power_source: EnergySourceKind::Rapl,
            running: 1,
            foreign_cpu: Some(0.1),
            conditions: Default::default(),
        }),
        AgentMessage::Status(AgentStatus { online: true, instance: 1 }),
        AgentMessage::Synced(7),
    ];
    let bodies: Vec<(AgentTopic, Vec<u8>)> =
        seeds.iter().map(|m| (AgentTopic::of_agent_message(m), tunefleet_common::encode(m).expect("encode"))).collect();
    let mutate = |rng: &mut rand::rngs::StdRng, mut bytes: Vec<u8>, most: u32| {
        for _ in 0..rng.random_range(1..=most) {
            let at = rng.random_range(0..=bytes.len());
            match rng.random_range(0..5) {
                0 if at < bytes.len() => bytes[at] ^= 1 << rng.random_range(0..8),
                1 if at < bytes.len() => bytes[at] = rng.random(),
                2 => bytes.insert(at, rng.random()),
                3 if at < bytes.len() => {
                    bytes.remove(at);
                }
                _ => bytes.truncate(at),
            }
        }
        bytes
    };
    let kinds = AgentTopic::ALL;
    let started = Instant::now();
    let mut inputs = 0u64;
    while started.elapsed().as_secs_f64() < secs {
        let mut events = Vec::new();
        for _ in 0..rng.random_range(1..8) {
            let (kind, body) = bodies[rng.random_range(0..bodies.len())].clone();
            let ev = match rng.random_range(0..4) {
                // Random bytes on any topic agents publish on.
                0 => {
                    let junk: Vec<u8> = (0..rng.random_range(0..256)).map(|_| rng.random()).collect();
                    wire(kinds[rng.random_range(0..kinds.len())], &junk)
                }
                // A real sealed frame, mutated on the wire (its MAC mostly fails).
                1 => {
                    let session = fx.agent.as_mut().expect("welcomed");
                    let frame = tunefleet_common::encode(&UpFrame::Sealed(session.seal(kind, body).expect("seal")))
                        .expect("encode");
                    wire(kind, &mutate(&mut rng, frame, 4))
                }
                // A mutated body under a valid MAC: it reaches decode, validate and handle.
                _ => {
                    // One change at a time mostly decodes: the values change, not the shape.
                    let most = if rng.random_bool(0.7) { 1 } else { 4 };
                    let body = mutate(&mut rng, body, most);
                    // An offline status would end the session and every later frame with it.
                    if let Ok(AgentMessage::Status(AgentStatus { online: false, .. })) = tunefleet_common::decode(&body)
                    {
                        continue;
                    }
                    fx.sealed_body(kind, body)
                }
            };
            events.push(ev);
            inputs += 1;
        }
        fx.turn(events);
        assert_eq!(fx.consistent(), Ok(()));
    }
    let rate = inputs as f64 / started.elapsed().as_secs_f64();
    let st = &fx.core.stats;
    // Opened, decoded and judged by validation or the handlers.
    let reached = st.invalid_messages + st.duplicate_results + st.unknown_results + st.assignments;
    println!(
        "fuzzed {inputs} frames in {:.1} s: {rate:.0} a second (seed {seed}); {reached} reached validation and the handlers",
        started.elapsed().as_secs_f64()
    );
    assert!(inputs > 100, "too few inputs: {inputs}");
    assert!(st.rejected_messages > 0 && st.bad_tokens > 0 && reached > 10, "{st:?}");
    // Still going: a result for an attempt never given is answered.
    let stray = TrialRef { study: "s".into(), study_id: RIG_STUDY_ID, trial: 3, attempt: 9 };
    let msg = fx.sealed(&AgentMessage::Result(TrialResult { trial: stray, measurement: full_measurement(1.0) }));
    let (_, out) = fx.turn(vec![msg]);
    assert_eq!(acks(&out).len(), 1, "the engine still answers");
    assert_eq!(fx.core.store.trials("s").expect("trials").len(), 4);
}

/// A trial reconfigured to a reused configuration ran under it;
/// its result records that configuration (it was NULL: no probe selected
/// one, and the plan of a pipelined trial names none).
#[test]
fn a_reconfigured_trial_records_the_configuration_it_ran() {
    use tunefleet_common::measurement::{Segment, SegmentRole};
    let mut fx = Fixture::new();
    let req =
        fx.sealed(&AgentMessage::Request(WorkRequest { seq: 1, free: 1, ahead: 0, running: vec![], held: vec![] }));
    let a = assigned(fx.turn(vec![req]).1).pop().expect("work");
    let ran = tunefleet_common::message::SystemParams { threads: Some(2), ..Default::default() };
    let mut m = ok_measurement(1.0);
    m.segments = vec![Segment {
        role: SegmentRole::Reconfigured,
        system: ran.clone(),
        cpus: Vec::new(),
        first_epoch: 1,
        last_epoch: 1,
        steps: 0,
        start_us: 0,
        wall_us: 5,
        energy_j: None,
        cpu_us: None,
        unit_median_us: None,
        unit_spread: None,
        margin: None,
    }];
    let msg = fx.sealed(&AgentMessage::Result(TrialResult { trial: a.trial.clone(), measurement: m }));
    fx.turn(vec![msg]);
    let best = fx.core.store.best("s", 1).expect("best");
    assert_eq!(best.first().and_then(|b| b.result.system.clone()), Some(ran), "{best:?}");
    assert_eq!(fx.consistent(), Ok(()));
}

/// A trial ASHA stops is told to a TPE search (Optuna's pruned
/// trials), through the engine: an epoch report behind the rung's cut stops
/// the trial, cancels its attempt on its agent, and the model has learnt it.
#[test]
fn a_trial_asha_stops_is_cancelled_and_told_to_the_tpe_search() {
    let study = STUDY.replace("kind = \"grid\"", "kind = \"tpe\"\nseed = 1")
        + "[early_stopping]\nkind = \"asha\"\nreduction = 2\ngrace = 1\n";
    let mut fx = Fixture::with_study(&study);
    let req =
        fx.sealed(&AgentMessage::Request(WorkRequest { seq: 1, free: 2, ahead: 0, running: vec![], held: vec![] }));
    let work = assigned(fx.turn(vec![req]).1);
    assert_eq!(work.len(), 2, "two trials on the agent's two slots");
    let report = |trial: &TrialRef, v: f64| Progress {
        trial: trial.clone(),
        epoch: 1,
        elapsed_us: 1,
        metrics: [("v".to_string(), v)].into(),
        checkpoint: None,
        profile: None,
    };
    let before = fx.core.studies["s"].search.observations();
    // v is maximised: the first sets the rung's bar, the second falls behind it.
    let events = vec![
        fx.sealed(&AgentMessage::Progress(report(&work[0].trial, 10.0))),
        fx.sealed(&AgentMessage::Progress(report(&work[1].trial, 1.0))),
    ];
    let (_, out) = fx.turn(events);
    let cancels: Vec<&TrialRef> = out
        .iter()
        .filter_map(|(_, m)| match m {
            // (The fixture's clock moves past every lease between turns: those are cancelled too.)
            CoordinatorMessage::Cancel(c) if c.reason.contains("ASHA") => Some(&c.trial),
            _ => None,
        })
        .collect();
    assert_eq!(cancels, vec![&work[1].trial], "the trial behind the cut is cancelled on its agent");
    assert_eq!(fx.core.stats.stopped, 1);
    assert_eq!(fx.core.studies["s"].search.observations(), before + 1, "the model learnt where ASHA cut");
    assert_eq!(fx.consistent(), Ok(()));
}

impl Fixture {
    /// Another agent `name` welcomed through a real handshake; its session.
    fn welcome(&mut self, name: &str) -> Session {
        self.welcome_as(name, AgentInfo { slots: 1, ..AgentInfo::minimal(name, 2) })
    }

    /// [`Fixture::welcome`] of an agent that says `info` of itself.
    fn welcome_as(&mut self, name: &str, info: AgentInfo) -> Session {
        let me = Identity::generate().expect("key").0;
        let (signed, pending) = auth::hello(&me, info, 9, 1, [0; 32], None).expect("hello");
        let hello =
            Inbound::Agent { agent: name.into(), kind: AgentTopic::Hello, frame: Box::new(UpFrame::Hello(signed)) };
        let (welcomes, _) = self.turn(vec![hello]);
        let (_, welcome) = welcomes.into_iter().find(|(a, _)| a == name).expect("a Welcome");
        let Ok(auth::DownFrame::Welcome(w)) = tunefleet_common::decode(&welcome) else { panic!("not a Welcome") };
        pending.finish(name, &self.core.sessions.public_key(), &w).expect("session")
    }
}

/// `msg` sealed in `session`, the session of agent `name`.
fn sealed_as(session: &mut Session, name: &str, msg: &AgentMessage) -> Inbound {
    let kind = AgentTopic::of_agent_message(msg);
    let body = tunefleet_common::encode(msg).expect("encode");
    let frame = tunefleet_common::encode(&UpFrame::Sealed(session.seal(kind, body).expect("seal"))).expect("encode");
    let topics = tunefleet_common::topic::Topics::default();
    crate::runtime::transport::classify(&topics, &topics.agent(name, kind), &frame)
}

/// The co-measurement steps sent to `agent` in `out`.
fn comeasures<'a>(out: &'a Messages, agent: &str) -> Vec<&'a tunefleet_common::message::CoMeasure> {
    out.iter()
        .filter_map(|(a, m)| match m {
            CoordinatorMessage::CoMeasure(c) if a == agent => Some(c),
            _ => None,
        })
        .collect()
}

/// A node's answer for `trial`'s window `(from, to)` (2 s): `joules`, valid.
fn node_answer(trial: &TrialRef, (from, to): (u64, u64), joules: f64) -> tunefleet_common::message::CoMeasured {
    let mut energy = EnergyReading::none(EnergySourceKind::Rapl, "co-measured");
    (energy.joules, energy.valid) = (joules, true);
    tunefleet_common::message::CoMeasured {
        trial: trial.clone(),
        from_unix_ms: from,
        to_unix_ms: to,
        energy,
        cpu_us: 7,
        cpus: 1,
        covered_ms: 2_000,
        gpus: vec![],
    }
}

/// A node of a study (`[measure] nodes`) is
/// told to start when a trial is assigned to another agent and the
/// trial's window when its result is stored; its answer for that window
/// is stored, while an answer from an agent not asked, for another window
/// or a second time is counted and dropped; a node that stays silent is
/// recorded as missing.
#[test]
fn a_node_measures_the_window_of_each_trial_and_forgeries_are_counted() {
    use tunefleet_common::message::{CoMeasureStep, CoMeasured};
    let study = STUDY.replace("[hyper.x]", "[measure]\nnodes = { tags = {} }\n[hyper.x]");
    let mut fx = Fixture::with_study(&study);
    let mut b = fx.welcome("b");
    let req =
        fx.sealed(&AgentMessage::Request(WorkRequest { seq: 1, free: 1, ahead: 0, running: vec![], held: vec![] }));
    let (_, out) = fx.turn(vec![req]);
    let starts = comeasures(&out, "b");
    let work = assigned(out.clone());
    assert_eq!(work.len(), 1);
    assert_eq!(starts.len(), 1, "{out:?}");
    let lease_ms = fx.core.studies["s"].study.timeout_s * 1000 + LEASE_GRACE.as_millis() as u64;
    assert_eq!((&starts[0].trial, starts[0].step), (&work[0].trial, CoMeasureStep::Start { within_ms: lease_ms }));
    assert!(comeasures(&out, "a").is_empty(), "the trial's own agent is no node of it");

    let trial = work[0].trial.clone();
    let mut m = ok_measurement(3.0);
    m.started_unix_ms = unix_ms();
    m.wall_us = 2_000_000;
    let result = fx.sealed(&AgentMessage::Result(TrialResult { trial: trial.clone(), measurement: m.clone() }));
    let (_, out) = fx.turn(vec![result]);
    let window = comeasures(&out, "b");
    let (from, to) = (m.started_unix_ms, m.started_unix_ms + 2_000);
    assert_eq!(window.len(), 1);
    assert_eq!(window[0].step, CoMeasureStep::Window { from_unix_ms: from, to_unix_ms: to });

    let answer = node_answer(&trial, (from, to), 40.0);
    let mut other_window = CoMeasured { to_unix_ms: to + 1, ..answer.clone() };
    other_window.energy.joules = 99.0;
    let events = vec![
        fx.sealed(&AgentMessage::CoMeasured(answer.clone())),
        sealed_as(&mut b, "b", &AgentMessage::CoMeasured(other_window)),
        sealed_as(&mut b, "b", &AgentMessage::CoMeasured(answer.clone())),
        sealed_as(&mut b, "b", &AgentMessage::CoMeasured(answer)),
    ];
    fx.turn(events);
    assert_eq!(fx.core.stats.refused_comeasures, 3, "not asked, another window, twice");
    let rows = fx.core.store.node_measurements("s").expect("rows");
    assert_eq!(rows.len(), 1);
    assert_eq!((rows[0].agent.as_str(), rows[0].joules, rows[0].valid), ("b", Some(40.0), true));
    assert_eq!((rows[0].from_unix_ms, rows[0].to_unix_ms), (Some(from), Some(to)), "the window asked, not another");

    // A node that never answers is recorded as missing once given up on.
    let req =
        fx.sealed(&AgentMessage::Request(WorkRequest { seq: 2, free: 1, ahead: 0, running: vec![], held: vec![] }));
    let second = assigned(fx.turn(vec![req]).1).pop().expect("work");
    let result = fx.sealed(&AgentMessage::Result(TrialResult { trial: second.trial.clone(), measurement: m }));
    fx.turn(vec![result]);
    fx.turn(Vec::new());
    assert_eq!(fx.core.stats.comeasures_missing, 1);
    let rows = fx.core.store.node_measurements("s").expect("rows");
    let missing = rows.iter().find(|r| r.trial == second.trial.trial).expect("a row for the silent node");
    assert!(!missing.valid && missing.joules.is_none(), "{missing:?}");
    assert!(missing.note.as_deref().is_some_and(|n| n.contains("no answer")), "{missing:?}");

    // An attempt that ends without a result (its lease ran out: the
    // fixture's clock passes every lease between turns) is abandoned on
    // its node, and nothing of it stays open.
    let req =
        fx.sealed(&AgentMessage::Request(WorkRequest { seq: 3, free: 1, ahead: 0, running: vec![], held: vec![] }));
    let third = assigned(fx.turn(vec![req]).1).pop().expect("work");
    let (_, out) = fx.turn(Vec::new());
    let abandoned = comeasures(&out, "b").iter().any(|c| c.trial == third.trial && c.step == CoMeasureStep::Abandon);
    assert!(abandoned, "{out:?}");
    assert!(fx.core.co.is_empty());
    assert_eq!(fx.consistent(), Ok(()));
}

/// The dispatch decides from what the engine holds and changes nothing:
/// the same message decided twice gives the same decision, the store and
/// the scheduler are as they were, and only the apply stage (the turn)
/// stores the result and settles the trial.
#[test]
fn the_dispatch_decides_without_changing_anything() {
    use super::dispatch::{decide, Decision, EngineView, Keep};
    let (mut fx, a) = resumable_trial_running();
    let result = AgentMessage::Result(TrialResult { trial: a.trial.clone(), measurement: ok_measurement(7.0) });
    static NO_PROFILES: crate::domain::reuse::Book =
        crate::domain::reuse::Book { classes: std::collections::BTreeMap::new() };
    fn view(core: &Core) -> EngineView<'_> {
        let book = core.book.as_ref().unwrap_or(&NO_PROFILES);
        EngineView { sched: &core.sched, studies: &core.studies, co: &core.co, book, remeasure: true, influx: true }
    }
    let decided = |core: &Core, msg: AgentMessage| format!("{:?}", decide(&view(core), "a", msg));
    let first = decided(&fx.core, result.clone());
    assert_eq!(first, decided(&fx.core, result.clone()), "deciding again decides the same");
    match decide(&view(&fx.core), "a", result.clone()) {
        Decision::Result(step) => {
            assert_eq!(step.judgement.verdict, crate::domain::sched::Verdict::Accepted);
            assert!(
                matches!(&step.keep, Keep::Result { objective: Some(v), points, .. } if *v == 7.0 && !points.is_empty()),
                "{:?}",
                step.keep
            );
        }
        other => panic!("a result decided as {other:?}"),
    }
    assert!(fx.core.store.results("s").expect("results").is_empty(), "nothing stored by deciding");
    assert!(!fx.core.sched.is_finished("s", a.trial.trial), "nothing settled by deciding");
    // Progress of an attempt that is not live decides nothing; a checkpoint
    // outside the study's prefix is dropped from the decision.
    let mut progress = Progress {
        trial: a.trial.clone(),
        epoch: 1,
        elapsed_us: 1,
        metrics: [("v".to_string(), 1.0)].into(),
        checkpoint: Some("/home/victim/.bashrc".into()),
        profile: None,
    };
    match decide(&view(&fx.core), "a", AgentMessage::Progress(progress.clone())) {
        Decision::Progress { progress: p, refused_checkpoint: Some(_), .. } => assert_eq!(p.checkpoint, None),
        other => panic!("{other:?}"),
    }
    progress.trial.attempt += 1;
    assert!(matches!(decide(&view(&fx.core), "a", AgentMessage::Progress(progress)), Decision::Nothing));
    // Applied by the turn: stored and settled.
    let msg = fx.sealed(&result);
    let (_, out) = fx.turn(vec![msg]);
    assert_eq!(acks(&out).iter().map(|a| a.outcome.clone()).collect::<Vec<_>>(), [AckOutcome::Stored]);
    assert_eq!(fx.core.store.results("s").expect("results").len(), 1);
    assert!(fx.core.sched.is_finished("s", a.trial.trial));
    // Decided again now: the scheduler knows it as a duplicate; an attempt
    // it never gave of a finished trial is the store's to judge.
    match decide(&view(&fx.core), "a", result) {
        Decision::Result(step) => assert_eq!(step.judgement.verdict, crate::domain::sched::Verdict::Duplicate),
        other => panic!("{other:?}"),
    }
    let never = TrialRef { attempt: a.trial.attempt + 1, ..a.trial.clone() };
    let stray = AgentMessage::Result(TrialResult { trial: never, measurement: ok_measurement(7.0) });
    match decide(&view(&fx.core), "a", stray) {
        Decision::Result(step) => assert_eq!(
            step.keep,
            Keep::Unknown { finished: true, why: "this coordinator never gave that attempt to this agent" }
        ),
        other => panic!("{other:?}"),
    }
}

/// A measuring node's energy ceiling grew with the
/// cores it claimed (12.2 MJ taken as valid for a trial that measured
/// 4 J). Its cores now count at most as the slots it was given: a node
/// claiming 60,000 cores on 1 slot may report 3.1 kW at most.
#[test]
fn regression_a_nodes_energy_ceiling_follows_its_grant_not_its_claimed_cores() {
    let study = STUDY.replace("[hyper.x]", "[measure]\nnodes = { tags = {} }\n[hyper.x]");
    let mut fx = Fixture::with_study(&study);
    let mut b = fx.welcome_as("b", AgentInfo { slots: 1, cores: 60_000, ..AgentInfo::minimal("b", 2) });
    let req =
        fx.sealed(&AgentMessage::Request(WorkRequest { seq: 1, free: 1, ahead: 0, running: vec![], held: vec![] }));
    let trial = assigned(fx.turn(vec![req]).1).pop().expect("work").trial;
    let mut m = ok_measurement(3.0);
    m.started_unix_ms = unix_ms();
    m.wall_us = 2_000_000;
    let (from, to) = (m.started_unix_ms, m.started_unix_ms + 2_000);
    let result = fx.sealed(&AgentMessage::Result(TrialResult { trial: trial.clone(), measurement: m }));
    fx.turn(vec![result]);
    let answer = node_answer(&trial, (from, to), 12.2e6);
    fx.turn(vec![sealed_as(&mut b, "b", &AgentMessage::CoMeasured(answer))]);
    assert_eq!(fx.core.stats.refused_comeasures, 1, "12.2 MJ over 2 s from a node of 1 slot");
    assert!(fx.core.store.node_measurements("s").expect("rows").iter().all(|r| r.joules.is_none()));
}

/// Co-measurement opened a window on every node for
/// each trial a member said it started (~67 meter commands a second under
/// a hoarder). Its nodes now measure at most as many of its trials at once
/// as it has slots.
#[test]
fn regression_a_member_starting_every_held_trial_opens_windows_only_for_its_slots() {
    use tunefleet_common::message::CoMeasureStep;
    let study = STUDY.replace("[hyper.x]", "[measure]\nnodes = { tags = {} }\n[hyper.x]");
    let mut fx = Fixture::with_study(&study);
    let _b = fx.welcome("b");
    let mut m = fx.welcome_as("m", AgentInfo { slots: 1, lookahead: 4, ..AgentInfo::minimal("m", 2) });
    let req = WorkRequest { seq: 1, free: 1, ahead: 4, running: vec![], held: vec![] };
    let work = assigned(fx.turn(vec![sealed_as(&mut m, "m", &AgentMessage::Request(req))]).1);
    assert!(work.len() >= 2, "a trial running and some held: {work:?}");
    let claims: Vec<Inbound> = work
        .iter()
        .map(|w| {
            let p = Progress {
                trial: w.trial.clone(),
                epoch: 1,
                elapsed_us: 1,
                metrics: tunefleet_common::measurement::Metrics::new(),
                checkpoint: None,
                profile: None,
            };
            sealed_as(&mut m, "m", &AgentMessage::Progress(p))
        })
        .collect();
    let (_, out) = fx.turn_after(1, claims);
    let starts = comeasures(&out, "b").iter().filter(|c| matches!(c.step, CoMeasureStep::Start { .. })).count();
    // The running one's window opened when it was assigned; held ones open none while it measures.
    assert_eq!(starts, 0, "{} trials said started, one slot: {out:?}", work.len());
    assert_eq!(fx.core.co.measuring_for("m"), 1);
}

/// After a lost database the core takes its studies back from the store
/// ([`Core::restore`]) as a restart would, but what this run decided of
/// them stays decided: a study it cancelled is cancelled again at the
/// next turn, and its failures still count from this run's start.
#[test]
fn a_study_taken_back_from_the_store_stays_as_this_run_decided() {
    let mut fx = Fixture::new();
    let given = slots_free(&mut fx, 1, 2);
    assert_eq!(given.len(), 2, "{given:?}");
    assert_eq!(answer(&mut fx, &given[0].trial, 1.0), AckOutcome::Stored);
    let at_start = fx.core.studies["s"].at_start;
    fx.clock_ms += STEP_MS;
    let out = fx.core.turn(Vec::new(), vec![Ask::Cancel { study: "s".into() }], false, fx.now()).expect("turn");
    assert!(matches!(&out.answers[..], [Answer::Ok { .. }]), "{:?}", out.answers);
    let started = fx.core.restore(fx.now()).expect("taken back");
    assert_eq!(started.iter().map(|s| s.study.as_str()).collect::<Vec<_>>(), ["s"]);
    assert_eq!(fx.core.studies["s"].at_start, at_start, "its failures count from this run's start");
    assert!(fx.core.sessions().live_agents().next().is_none(), "every session ended");
    fx.turn(Vec::new());
    assert!(fx.core.studies["s"].cancelled, "cancelled again");
    assert!(!fx.core.has_work());
    fx.consistent().expect("the scheduler as the store says");
}

/// A study submitted as the database was lost may have been kept by the
/// store though the submit was answered with the error: taken back with
/// the others where the store kept it, and only then; a study the store
/// runs for another coordinator (a `run` beside the service) is left alone.
#[test]
fn a_study_submitted_as_the_database_was_lost_is_taken_back_where_the_store_kept_it() {
    let mut fx = Fixture::new();
    let mut batch = fx.core.store.batch().expect("batch");
    for name in ["kept", "other"] {
        super::open_study(&mut batch, &study_named(name), &[]).expect("in the store");
    }
    batch.commit().expect("commit");
    fx.core.submitted_when_lost = vec![study_named("kept"), study_named("lost")];
    let started = fx.core.restore(fx.now()).expect("taken back");
    let mut names: Vec<&str> = started.iter().map(|s| s.study.as_str()).collect();
    names.sort();
    assert_eq!(names, ["kept", "s"]);
    assert!(fx.core.studies.contains_key("kept"));
    assert!(!fx.core.studies.contains_key("other"), "a study of another coordinator's");
    assert!(!fx.core.studies.contains_key("lost"), "a study the store did not keep");
    assert!(fx.core.submitted_when_lost.is_empty());
    fx.consistent().expect("the scheduler as the store says");
}

/// [`STUDY`] under another name.
fn study_named(name: &str) -> crate::domain::study::Study {
    crate::domain::study::parse(&STUDY.replace("name = \"s\"", &format!("name = \"{name}\"")), "t.toml")
        .expect("study")
        .expand()
        .remove(0)
}

/// The read after a submit's commit may fail on a connection that is made
/// again before the turn's own commit: no pause comes, and the study the
/// store kept is taken back at the next tick.
#[test]
fn a_study_submitted_as_the_database_was_lost_is_taken_back_at_the_next_tick() {
    let mut fx = Fixture::new();
    let mut batch = fx.core.store.batch().expect("batch");
    super::open_study(&mut batch, &study_named("kept"), &[]).expect("in the store");
    batch.commit().expect("commit");
    fx.core.submitted_when_lost = vec![study_named("kept")];
    fx.turn(Vec::new());
    assert!(fx.core.studies.contains_key("kept"), "taken back at the tick");
    assert!(fx.core.submitted_when_lost.is_empty());
    fx.consistent().expect("the scheduler as the store says");
}
