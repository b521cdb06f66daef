//! Property tests: every message survives encode/decode, and arbitrary bytes
//! decode to an error rather than a panic.

use std::collections::BTreeMap;

use proptest::prelude::*;
use tunefleet_common::auth::{DownFrame, Hello, Sealed, Signed, UpFrame, Will};
use tunefleet_common::measurement::*;
use tunefleet_common::message::*;
use tunefleet_common::params::SystemParams;
use tunefleet_common::profile::{Profile, PROFILE_VERSION};
use tunefleet_common::{decode, encode};

fn trial_ref() -> impl Strategy<Value = TrialRef> {
    ("[a-z0-9-]{1,12}", any::<u64>(), any::<u64>(), any::<u32>())
        .prop_map(|(study, study_id, trial, attempt)| TrialRef { study, study_id, trial, attempt })
}

fn metrics() -> impl Strategy<Value = Metrics> {
    prop::collection::btree_map("[a-z_]{1,8}", -1e9f64..1e9, 0..4)
}

fn measurement() -> impl Strategy<Value = Measurement> {
    (
        any::<u64>(),
        any::<u64>(),
        any::<i32>(),
        prop::collection::vec((any::<u32>(), metrics()), 0..4),
        metrics(),
        prop::collection::vec(("[a-z-]{1,12}", any::<bool>(), any::<u64>(), any::<u64>()), 0..4),
        0.0f64..1e6,
        ".{0,40}",
    )
        .prop_map(|(start, wall, code, epochs, final_metrics, counters, joules, log)| Measurement {
            started_unix_ms: start,
            wall_us: wall,
            user_us: wall / 2,
            sys_us: wall / 3,
            max_rss_kib: 1024,
            exit: if code % 2 == 0 { ExitOutcome::Exited(code) } else { ExitOutcome::SpawnFailed(log.clone()) },
            epochs: epochs
                .into_iter()
                .map(|(epoch, metrics)| EpochMetrics {
                    epoch,
                    elapsed_us: 7,
                    metrics,
                    checkpoint: Some("/ckpt".into()),
                })
                .collect(),
            final_metrics,
            counters: counters
                .into_iter()
                .map(|(event, hw, value, t)| CounterReading {
                    event,
                    kind: if hw { CounterKind::Hardware } else { CounterKind::Software },
                    value,
                    time_enabled_ns: t,
                    time_running_ns: t / 2,
                })
                .collect(),
            counters_missing: vec![MissingCounter { event: "cycles".into(), reason: "not supported".into() }],
            counter_series: vec![CounterSample { elapsed_ms: 1000, deltas: vec![joules, 2.0] }],
            profile: Profile { version: PROFILE_VERSION, values: vec![Some(joules), None, Some(0.5)] },
            energy: EnergyReading {
                source: EnergySourceKind::Estimated,
                joules,
                domains: vec![DomainEnergy { domain: "cpu".into(), joules, in_total: true }],
                interval_ms: 1000,
                valid: true,
                note: None,
                series: vec![PowerSample { elapsed_ms: 1000, watts: joules }],
            },
            limits: AppliedLimits {
                cpus: vec![0, 1],
                threads: Some(2),
                memory: MemoryLimit::Rlimit { bytes: 1 << 30 },
            },
            log_tail: log,
            segments: vec![tunefleet_common::measurement::Segment {
                role: tunefleet_common::measurement::SegmentRole::Probe,
                system: SystemParams { cores: Some(2), threads: Some(1), memory_mib: None },
                cpus: vec![0, 1],
                first_epoch: 1,
                last_epoch: 2,
                steps: 0,
                start_us: 5,
                wall_us: wall,
                energy_j: Some(joules),
                cpu_us: None,
                unit_median_us: None,
                unit_spread: None,
                margin: None,
            }],
            selected: Some(SystemParams { cores: Some(2), threads: Some(1), memory_mib: None }),
            window_profile: Some(tunefleet_common::measurement::WindowProfile {
                system: SystemParams { cores: Some(2), threads: None, memory_mib: None },
                epochs: 1,
                steps: 0,
                wall_us: wall,
                profile: Profile { version: PROFILE_VERSION, values: vec![None, Some(joules)] },
            }),
            interference: vec!["foreign load 0.8 of the agent's CPUs".into()],
            gpus: vec![],
            cpu_share: None,
        })
}

fn single_agent_message() -> impl Strategy<Value = AgentMessage> {
    prop_oneof![
        (trial_ref(), measurement())
            .prop_map(|(trial, measurement)| AgentMessage::Result(TrialResult { trial, measurement })),
        (trial_ref(), any::<u32>(), metrics()).prop_map(|(trial, epoch, metrics)| {
            AgentMessage::Progress(Progress { trial, epoch, elapsed_us: 5, metrics, checkpoint: None, profile: None })
        }),
        (any::<u64>(), any::<u32>(), prop::collection::vec(trial_ref(), 0..3)).prop_map(|(seq, free, running)| {
            AgentMessage::Request(WorkRequest { seq, free, ahead: 0, running, held: vec![] })
        }),
        (any::<bool>(), any::<u64>())
            .prop_map(|(online, instance)| AgentMessage::Status(AgentStatus { online, instance })),
        (any::<u64>(), 0.0f64..1.0, prop::option::of(0.0f64..500.0), any::<u64>()).prop_map(
            |(unix_ms, cpu, power_watts, mem)| AgentMessage::Telemetry(Telemetry {
                unix_ms,
                interval_ms: 1000,
                cpu_utilisation: cpu,
                per_cpu: vec![cpu, 1.0 - cpu],
                memory_used_bytes: mem / 2,
                memory_total_bytes: mem,
                power_watts,
                power_source: EnergySourceKind::Rapl,
                running: 1,
                foreign_cpu: Some(1.0 - cpu),
                conditions: Conditions {
                    charging: Some(false),
                    battery_percent: power_watts,
                    throttled: None,
                    temperature_c: Some(41.5),
                },
            })
        ),
        ("[a-z0-9-]{1,10}", any::<u64>(), prop::collection::btree_map("[a-z]{1,5}", "[a-z]{0,5}", 0..3)).prop_map(
            |(agent, instance, tags)| agent_info(AgentInfo {
                agent,
                instance,
                version: "0.1.0".into(),
                arch: "aarch64".into(),
                os: "linux".into(),
                kernel: "6.1".into(),
                cores: 8,
                memory_bytes: 1 << 33,
                slots: 2,
                lookahead: 0,
                energy: vec![EnergySourceInfo {
                    kind: EnergySourceKind::Rapl,
                    domains: vec!["package-0".into()],
                    readable: false,
                    note: Some("root only".into())
                }],
                counters: vec!["task-clock".into()],
                tags: tags.into_iter().collect::<BTreeMap<_, _>>(),
                gpus: vec![],
            })
        ),
    ]
}

fn single_coordinator_message() -> impl Strategy<Value = CoordinatorMessage> {
    prop_oneof![
        (trial_ref(), any::<u64>(), prop::collection::vec(".{0,10}", 1..5), prop::option::of(1u32..64)).prop_map(
            |(trial, request_seq, argv, cores)| CoordinatorMessage::Assign(Assignment {
                trial,
                request_seq,
                spec: TrialSpec {
                    argv,
                    env: vec![("OMP_NUM_THREADS".into(), "2".into())],
                    system: SystemParams { cores, threads: cores, memory_mib: Some(512) },
                    timeout_ms: 60_000,
                    probe: Some(tunefleet_common::message::ProbePlan {
                        configs: vec![
                            SystemParams::default(),
                            SystemParams { cores: Some(1), ..SystemParams::default() }
                        ],
                        window: 1,
                        warmup: 0,
                        unit: tunefleet_common::message::WindowUnit::Steps,
                        select: tunefleet_common::message::Select::Cost { eta_permille: 500 },
                        control: true,
                        from_best: true,
                    }),
                    gpus: 0,
                },
            })
        ),
        (trial_ref(), ".{0,20}").prop_map(|(trial, reason)| CoordinatorMessage::Cancel(Cancel { trial, reason })),
        (trial_ref(), 0u8..3, ".{0,20}").prop_map(|(trial, o, why)| CoordinatorMessage::Ack(ResultAck {
            trial,
            outcome: match o {
                0 => AckOutcome::Stored,
                1 => AckOutcome::Duplicate,
                _ => AckOutcome::Refused(why),
            }
        })),
        any::<u64>().prop_map(CoordinatorMessage::Sync),
    ]
}

/// A message, or a bundle of 2 to 4 (which unbundles to them, in order).
fn agent_message() -> impl Strategy<Value = AgentMessage> {
    let bundleable = single_agent_message().prop_filter("a status is never bundled", AgentMessage::bundleable);
    prop_oneof![
        3 => single_agent_message(),
        1 => prop::collection::vec(bundleable, 2..5).prop_map(|msgs| {
            let bundle = AgentMessage::bundle(&msgs).expect("bundles");
            assert_eq!(bundle.clone().unbundle().expect("unbundles"), msgs);
            bundle
        }),
    ]
}

/// A message, or a bundle of 2 to 4 (which unbundles to them, in order).
fn coordinator_message() -> impl Strategy<Value = CoordinatorMessage> {
    prop_oneof![
        3 => single_coordinator_message(),
        1 => prop::collection::vec(single_coordinator_message(), 2..5).prop_map(|msgs| {
            let bundle = CoordinatorMessage::bundle(&msgs).expect("bundles");
            assert_eq!(bundle.clone().unbundle().expect("unbundles"), msgs);
            bundle
        }),
    ]
}

/// An agent's description travels inside its signed Hello; this carries it
/// through the codec as a Synced message plus the Hello body round trip.
fn agent_info(info: AgentInfo) -> AgentMessage {
    let hello = Hello {
        info,
        key: [1; 32],
        exchange: [2; 32],
        coordinator_instance: 3,
        seq: 4,
        will_hash: [5; 32],
        enrol: None,
    };
    let bytes = encode(&hello).expect("encodes");
    assert_eq!(decode::<Hello>(&bytes).expect("decodes"), hello);
    AgentMessage::Synced(hello.seq)
}

fn up_frame() -> impl Strategy<Value = UpFrame> {
    prop_oneof![
        (any::<u64>(), any::<u64>(), prop::collection::vec(any::<u8>(), 0..64))
            .prop_map(|(token, seq, body)| UpFrame::Sealed(Sealed { token, seq, body })),
        (any::<u64>(), any::<[u8; 32]>()).prop_map(|(instance, secret)| UpFrame::Will(Will { instance, secret })),
        (prop::collection::vec(any::<u8>(), 0..64), prop::collection::vec(any::<u8>(), 0..64))
            .prop_map(|(body, signature)| UpFrame::Hello(Signed { body, signature })),
    ]
}

proptest! {
    #[test]
    fn agent_messages_round_trip(msg in agent_message()) {
        let bytes = encode(&msg).expect("encodes");
        prop_assert_eq!(decode::<AgentMessage>(&bytes).expect("decodes"), msg);
    }

    #[test]
    fn coordinator_messages_round_trip(msg in coordinator_message()) {
        let bytes = encode(&msg).expect("encodes");
        prop_assert_eq!(decode::<CoordinatorMessage>(&bytes).expect("decodes"), msg);
    }

    #[test]
    fn frames_round_trip(frame in up_frame()) {
        let bytes = encode(&frame).expect("encodes");
        prop_assert_eq!(decode::<UpFrame>(&bytes).expect("decodes"), frame);
    }

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode::<AgentMessage>(&bytes);
        let _ = decode::<CoordinatorMessage>(&bytes);
        let _ = decode::<UpFrame>(&bytes);
        let _ = decode::<DownFrame>(&bytes);
        let _ = decode::<Signed>(&bytes);
    }

    #[test]
    fn truncated_messages_are_errors(msg in agent_message(), cut in 1usize..64) {
        let bytes = encode(&msg).expect("encodes");
        let keep = bytes.len().saturating_sub(cut).max(1);
        if keep < bytes.len() {
            prop_assert!(decode::<AgentMessage>(&bytes[..keep]).is_err());
        }
    }
}
