//! The scheduler's tests: its decisions, and its indexes against a full scan.

use proptest::prelude::*;

use tunefleet_common::message::{AgentStatus, WorkRequest, MAX_LOOKAHEAD_PER_SLOT};

use super::fleet::credit;
use super::*;

fn info(name: &str, instance: u64, arch: &str, tags: &[(&str, &str)]) -> AgentInfo {
    AgentInfo {
        agent: name.into(),
        instance,
        version: "t".into(),
        arch: arch.into(),
        os: "linux".into(),
        kernel: "6".into(),
        cores: 2,
        memory_bytes: 1 << 30,
        slots: 2,
        lookahead: 0,
        energy: vec![],
        counters: vec![],
        tags: tags.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        gpus: vec![],
    }
}

/// A study of any agent, leases of 1 s.
fn policy(name: &str, id: u64, max_attempts: u32, lookahead: bool) -> StudyPolicy {
    let ahead_per_slot = if lookahead { MAX_LOOKAHEAD_PER_SLOT } else { 0 };
    StudyPolicy {
        name: name.into(),
        id,
        selector: Selector::default(),
        max_attempts,
        ahead_per_slot,
        ahead_per_agent: None,
        lease_ms: 1_000,
        gpus: 0,
        store_share: u64::MAX,
    }
}

fn sched(trials: usize, max_attempts: u32, selector: Selector) -> Scheduler {
    let mut s = Scheduler::new();
    let policy = StudyPolicy {
        name: "s".into(),
        id: 7,
        selector,
        max_attempts,
        ahead_per_slot: MAX_LOOKAHEAD_PER_SLOT,
        ahead_per_agent: None,
        lease_ms: 1_000,
        gpus: 0,
        store_share: u64::MAX,
    };
    s.add_study(policy, vec![Restored::Pending { last_attempt: 0, failures: 0 }; trials], 0);
    s
}

/// A study of `trials` and agents `a` and `b`, both announced.
fn agents_a_and_b(trials: usize, max_attempts: u32) -> Scheduler {
    let mut s = sched(trials, max_attempts, Selector::default());
    s.hello(info("a", 1, "x86_64", &[]));
    s.hello(info("b", 1, "x86_64", &[]));
    s
}

fn req(seq: u64, free: u32) -> WorkRequest {
    WorkRequest { seq, free, ahead: 0, running: vec![], held: vec![] }
}

fn assigned(effects: &[Effect]) -> Vec<(String, TrialRef)> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Assign { agent, trial, .. } => Some((agent.clone(), trial.clone())),
            _ => None,
        })
        .collect()
}

#[test]
fn attempts_on_their_way_are_not_given_again_to_a_newer_request() {
    let mut s = sched(6, 1, Selector::default());
    s.hello(info("a", 1, "x86_64", &[]));
    s.request("a", &req(1, 2));
    let first = assigned(&s.assign(0));
    assert_eq!(first.len(), 2);
    // Asked again before the two assignments arrived: no slot is free.
    s.request("a", &req(2, 2));
    assert!(assigned(&s.assign(0)).is_empty(), "both slots are taken by attempts on their way");
    // It runs one of them and finished the other: one slot.
    assert_eq!(s.result("a", &first[0].1, ResultKind::Complete { success: true }, 0).0, Verdict::Accepted);
    let running = vec![first[1].1.clone()];
    s.request("a", &WorkRequest { seq: 3, free: 1, ahead: 0, running, held: vec![] });
    assert_eq!(assigned(&s.assign(0)).len(), 1);
}

#[test]
fn studies_that_share_agents_take_turns() {
    let mut s = sched(6, 1, Selector::default());
    s.add_study(policy("t", 8, 1, true), vec![Restored::Pending { last_attempt: 0, failures: 0 }; 6], 0);
    s.hello(AgentInfo { slots: 4, ..info("a", 1, "x86_64", &[]) });
    s.request("a", &req(1, 4));
    let order: Vec<String> = assigned(&s.assign(0)).into_iter().map(|(_, t)| t.study).collect();
    assert_eq!(order, vec!["s", "t", "s", "t"], "a study listed first does not starve the next");
    // Where one study has nothing left, the other takes every slot.
    let mut lone = sched(0, 1, Selector::default());
    lone.add_study(policy("t", 8, 1, true), vec![Restored::Pending { last_attempt: 0, failures: 0 }; 3], 0);
    lone.hello(AgentInfo { slots: 3, ..info("a", 1, "x86_64", &[]) });
    lone.request("a", &req(1, 3));
    assert_eq!(assigned(&lone.assign(0)).len(), 3);
}

#[test]
fn an_open_study_takes_trials_added_later_and_finishes_only_once_closed() {
    let mut s = sched(0, 3, Selector::default());
    s.set_open("s", true);
    s.hello(info("a", 1, "x86_64", &[]));
    s.request("a", &req(1, 2));
    assert_eq!(s.demand("s"), 2, "two free slots, nothing queued");
    assert_eq!(s.add_trial("s"), Some(0));
    assert_eq!(s.demand("s"), 1);
    let a = assigned(&s.assign(0));
    assert_eq!(a.len(), 1);
    let (v, _) = s.result("a", &a[0].1, ResultKind::Complete { success: true }, 0);
    assert_eq!(v, Verdict::Accepted);
    assert!(!s.counts("s").expect("study").finished(), "open: more trials may come");
    s.set_open("s", false);
    assert!(s.counts("s").expect("study").finished());
    assert_eq!(s.add_trial("nope"), None);
}

#[test]
fn an_overloaded_agent_gets_nothing_and_its_trials_move_without_counting_a_failure() {
    let mut s = agents_a_and_b(2, 1);
    s.request("a", &req(1, 2));
    let on_a = assigned(&s.assign(0));
    assert_eq!(on_a.len(), 2);
    let effects = s.set_overloaded("a", Some("busy".into()), 1_000);
    let moved: Vec<_> = effects.iter().filter(|e| matches!(e, Effect::Moved { from, .. } if from == "a")).collect();
    let cancelled = effects.iter().filter(|e| matches!(e, Effect::Cancel { agent, .. } if agent == "a")).count();
    assert_eq!((moved.len(), cancelled), (2, 2), "{effects:?}");
    assert!(s.set_overloaded("a", Some("still busy".into()), 1_500).is_empty(), "said once");
    // a asks again: nothing while overloaded; b takes both (max_attempts 1: a failure would fail them).
    s.request("a", &req(2, 2));
    assert!(assigned(&s.assign(2_000)).is_empty());
    s.request("b", &req(1, 2));
    let on_b = assigned(&s.assign(2_000));
    assert_eq!(on_b.iter().map(|(a, t)| (a.as_str(), t.attempt)).collect::<Vec<_>>(), vec![("b", 2), ("b", 2)]);
    for (_, t) in &on_b {
        assert_eq!(s.result("b", t, ResultKind::Complete { success: true }, 3_000).0, Verdict::Accepted);
    }
    let c = s.counts("s").expect("study");
    assert_eq!((c.done, c.failed), (2, 0));
}

#[test]
fn a_moved_trial_stays_off_its_agent_for_a_while_even_when_it_recovers() {
    let mut s = sched(1, 3, Selector::default());
    s.hello(info("a", 1, "x86_64", &[]));
    s.request("a", &req(1, 1));
    assert_eq!(assigned(&s.assign(0)).len(), 1);
    s.set_overloaded("a", Some("busy".into()), 0);
    assert!(s.set_overloaded("a", None, 10).is_empty());
    assert_eq!(s.overloaded("a"), None);
    s.request("a", &req(2, 1));
    assert!(assigned(&s.assign(100)).is_empty(), "kept off a");
    let later = assigned(&s.assign(AVOID_MS + 1));
    assert_eq!(later.len(), 1, "back on a once the avoidance ends");
}

#[test]
fn a_moved_trial_stays_in_its_device_class() {
    let mut s = sched(1, 3, Selector::default());
    s.hello(info("x86", 1, "x86_64", &[]));
    s.hello(info("arm", 1, "aarch64", &[]));
    s.hello(info("x86-2", 1, "x86_64", &[]));
    s.request("x86", &req(1, 1));
    assert_eq!(assigned(&s.assign(0)).len(), 1);
    s.set_overloaded("x86", Some("busy".into()), 0);
    s.request("arm", &req(1, 1));
    assert!(assigned(&s.assign(10)).is_empty(), "another class would not measure the same thing");
    s.request("x86-2", &req(1, 1));
    let a = assigned(&s.assign(20));
    assert_eq!(a.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), vec!["x86-2"]);
}

#[test]
fn a_disturbed_measurement_is_taken_again_then_accepted_flagged() {
    let mut s = agents_a_and_b(1, 1);
    let mut now = 0;
    for round in 0..=MAX_REMEASURES {
        for agent in ["a", "b"] {
            s.request(agent, &req(u64::from(round) + 1, 1));
        }
        now += AVOID_MS + 1;
        let a = assigned(&s.assign(now));
        assert_eq!(a.len(), 1, "round {round}");
        let (agent, t) = &a[0];
        let kind = ResultKind::Interfered { success: true, reason: "outside load".into() };
        let (v, effects) = s.result(agent, t, kind, now);
        if round < MAX_REMEASURES {
            assert_eq!(v, Verdict::Remeasured);
            assert!(matches!(&effects[..], [Effect::Moved { reason, .. }] if reason.contains("measured again")));
        } else {
            assert_eq!(v, Verdict::Accepted, "after {MAX_REMEASURES} re-measurements the flagged one is kept");
        }
    }
    let c = s.counts("s").expect("study");
    assert_eq!((c.done, c.failed), (1, 0), "max_attempts 1: re-measuring is no failure");
}

#[test]
fn regression_a_request_is_capped_at_the_announced_slots() {
    let mut s = sched(20, 1, Selector::default());
    s.hello(info("a", 1, "x86_64", &[]));
    // Announced 2 slots, asks for a thousand.
    s.request("a", &req(1, 1_000));
    let first = assigned(&s.assign(0));
    assert_eq!(first.len(), 2, "no more than its 2 announced slots");
    // Again, listing both as running: both slots are held.
    s.request(
        "a",
        &WorkRequest {
            seq: 2,
            free: 1_000,
            ahead: 0,
            running: first.iter().map(|(_, t)| t.clone()).collect(),
            held: vec![],
        },
    );
    assert!(assigned(&s.assign(0)).is_empty(), "its slots are all held");
    // Lying about what it runs does not free a slot either.
    s.request("a", &req(3, 1_000));
    s.request("a", &req(4, 1_000));
    assert!(assigned(&s.assign(0)).is_empty(), "leases it holds count whatever it says");
    assert_eq!(s.counts("s").map(|c| c.running), Some(2));
    // One finished: one slot again.
    assert_eq!(s.result("a", &first[0].1, ResultKind::Complete { success: true }, 0).0, Verdict::Accepted);
    s.request("a", &req(5, 1_000));
    assert_eq!(assigned(&s.assign(0)).len(), 1);
    assert_eq!(credit(1_000, 2, 0, 0), 2);
    assert_eq!(credit(1, 2, 0, 0), 1, "it may ask for fewer");
    assert_eq!(credit(2, 2, 1, 1), 1);
    assert_eq!(credit(5, 4, 0, 9), 0);
}

#[test]
fn regression_a_slot_freed_by_a_result_on_its_way_is_given_to_the_request_that_asked_for_it() {
    // After a broker outage the agent asks (free 1, running nothing)
    // before its spooled result ends the lease it still holds: the cap
    // withholds the slot, and the result gives it back (the agent does
    // not ask again: its slot was free when it asked).
    let mut s = sched(3, 1, Selector::default());
    s.hello(AgentInfo { slots: 1, ..info("a", 1, "x86_64", &[]) });
    s.request("a", &req(1, 1));
    let first = assigned(&s.assign(0));
    assert_eq!(first.len(), 1);
    // It runs it (listed), then finishes it while the broker is away and asks again.
    s.request("a", &WorkRequest { seq: 2, free: 0, ahead: 0, running: vec![first[0].1.clone()], held: vec![] });
    s.request("a", &req(3, 1));
    assert!(assigned(&s.assign(0)).is_empty(), "its one slot is held until the result comes");
    assert_eq!(s.result("a", &first[0].1, ResultKind::Complete { success: true }, 0).0, Verdict::Accepted);
    assert_eq!(assigned(&s.assign(0)).len(), 1, "the slot the result freed goes to the request");
    assert!(assigned(&s.assign(0)).is_empty(), "once");
}

#[test]
fn never_assigns_more_than_requested() {
    let mut s = sched(10, 3, Selector::default());
    s.hello(info("a", 1, "x86_64", &[]));
    assert!(s.assign(0).is_empty(), "no request yet, no work");
    s.request("a", &req(1, 2));
    let first = assigned(&s.assign(0));
    assert_eq!(first.len(), 2);
    assert!(s.assign(0).is_empty());
    // A stale (older) request grants nothing.
    s.request("a", &req(1, 5));
    assert!(s.assign(0).is_empty());
    // One finished: the newer request's free slot is given.
    assert_eq!(s.result("a", &first[0].1, ResultKind::Complete { success: true }, 0).0, Verdict::Accepted);
    s.request("a", &WorkRequest { seq: 2, free: 1, ahead: 0, running: vec![first[1].1.clone()], held: vec![] });
    assert_eq!(assigned(&s.assign(0)).len(), 1);
}

#[test]
fn selector_is_respected() {
    let sel = Selector {
        arch: vec!["aarch64".into()],
        tags: [("pool".to_string(), "gpu".to_string())].into(),
        ..Selector::default()
    };
    let mut s = sched(4, 3, sel);
    s.hello(info("wrong-tag", 1, "aarch64", &[("pool", "cpu")]));
    s.hello(info("wrong-arch", 1, "x86_64", &[("pool", "gpu")]));
    s.hello(AgentInfo { slots: 4, ..info("good", 1, "aarch64", &[("pool", "gpu"), ("x", "y")]) });
    for a in ["wrong-tag", "wrong-arch", "good"] {
        s.request(a, &req(1, 4));
    }
    let got = assigned(&s.assign(0));
    assert_eq!(got.len(), 4);
    assert!(got.iter().all(|(a, _)| a == "good"));
    assert_eq!(s.eligible_agents("s"), 1);
}

#[test]
fn regression_reuse_learns_only_from_agents_the_selector_admits() {
    let sel = Selector { tags: [("pool".to_string(), "lab".to_string())].into(), ..Selector::default() };
    let mut s = sched(2, 1, sel);
    s.hello(info("member", 1, "x86_64", &[("pool", "lab")]));
    s.hello(info("stranger", 1, "x86_64", &[("pool", "home")]));
    assert!(s.admits("s", "member"));
    assert!(!s.admits("s", "stranger"), "another pool's profiles do not join this study's model");
    assert!(!s.admits("s", "never-seen"));
    assert!(!s.admits("other-study", "member"));
    // It says it is something else now: no longer admitted.
    s.hello(info("member", 1, "x86_64", &[("pool", "home")]));
    assert!(!s.admits("s", "member"));
}

#[test]
fn offline_agent_trials_are_requeued_and_late_results_win_once() {
    let mut s = agents_a_and_b(1, 5);
    s.request("a", &req(1, 1));
    let first = assigned(&s.assign(0));
    assert_eq!(first[0].0, "a");
    let t1 = first[0].1.clone();
    s.started("a", &t1);
    let eff = s.status("a", &AgentStatus { online: false, instance: 1 });
    assert!(matches!(&eff[..], [Effect::Requeued { .. }]), "{eff:?}");
    s.request("b", &req(1, 1));
    let second = assigned(&s.assign(0));
    assert_eq!(second[0].0, "b");
    let t2 = second[0].1.clone();
    assert_eq!(t2.attempt, t1.attempt + 1);
    // The presumed-dead agent delivers after all: accepted, b is told to stop.
    let (v, eff) = s.result("a", &t1, ResultKind::Complete { success: true }, 0);
    assert_eq!(v, Verdict::Accepted);
    assert!(matches!(&eff[..], [Effect::Cancel { agent, .. }] if agent == "b"));
    assert_eq!(s.result("a", &t1, ResultKind::Complete { success: true }, 0).0, Verdict::Duplicate);
    assert_eq!(s.result("b", &t2, ResultKind::Complete { success: true }, 0).0, Verdict::Superseded);
    assert_eq!(s.counts("s").map(|c| (c.done, c.finished())), Some((1, true)));
}

/// A good result that arrived after its trial had run out of
/// attempts was kept as superseded, and the trial stayed failed.
#[test]
fn regression_late_result_of_a_failed_trial_completes_it_once() {
    let mut s = sched(2, 1, Selector::default());
    s.hello(info("a", 1, "x86_64", &[]));
    s.request("a", &req(1, 2));
    let got = assigned(&s.assign(0));
    let (t0, t1) = (got[0].1.clone(), got[1].1.clone());
    s.request("a", &WorkRequest { seq: 2, free: 0, ahead: 0, running: vec![t0.clone(), t1.clone()], held: vec![] });
    // The agent is presumed dead: with one attempt allowed, both trials fail.
    let eff = s.status("a", &AgentStatus { online: false, instance: 1 });
    assert_eq!(eff.iter().filter(|e| matches!(e, Effect::Failed { .. })).count(), 2, "{eff:?}");
    assert_eq!(s.counts("s").map(|c| (c.done, c.failed)), Some((0, 2)));
    assert_eq!(s.result("mallory", &t0, ResultKind::Complete { success: true }, 0).0, Verdict::Unknown);
    assert_eq!(s.result("a", &t0, ResultKind::Retry("cancelled".into()), 0).0, Verdict::Superseded);
    // It was alive after all: its real results count, once each.
    assert_eq!(s.result("a", &t0, ResultKind::Complete { success: true }, 0), (Verdict::Accepted, vec![]));
    assert_eq!(s.result("a", &t0, ResultKind::Complete { success: true }, 0).0, Verdict::Duplicate);
    assert_eq!(s.counts("s").map(|c| (c.done, c.failed)), Some((1, 1)));
    // A run that failed on its own is the failed trial's result: still failed, counted once.
    assert_eq!(s.result("a", &t1, ResultKind::Complete { success: false }, 0).0, Verdict::Accepted);
    assert_eq!(s.result("a", &t1, ResultKind::Complete { success: true }, 0).0, Verdict::Duplicate);
    let c = s.counts("s").expect("study");
    assert_eq!((c.done, c.failed, c.running, c.finished()), (1, 1, 0, true));
}

/// Found by the engine's property test: a disturbed result of a trial
/// that had failed for want of a result made it done and left it
/// counted failed as well (the scheduler counted 5 trials of 4).
#[test]
fn regression_a_disturbed_late_result_of_a_failed_trial_counts_once() {
    let mut s = sched(1, 1, Selector::default());
    s.hello(info("a", 1, "x86_64", &[]));
    s.request("a", &req(1, 1));
    let t0 = assigned(&s.assign(0))[0].1.clone();
    s.started("a", &t0);
    s.status("a", &AgentStatus { online: false, instance: 1 });
    assert_eq!(s.counts("s").map(|c| (c.done, c.failed)), Some((0, 1)));
    let disturbed = ResultKind::Interfered { success: true, reason: "load".into() };
    assert_eq!(s.result("a", &t0, disturbed, 0).0, Verdict::Accepted);
    assert_eq!(s.counts("s").map(|c| (c.done, c.failed)), Some((1, 0)));
}

#[test]
fn forged_or_unknown_results_are_refused() {
    let mut s = sched(2, 3, Selector::default());
    s.hello(info("a", 1, "x86_64", &[]));
    s.request("a", &req(1, 1));
    let t = assigned(&s.assign(0))[0].1.clone();
    assert_eq!(s.result("mallory", &t, ResultKind::Complete { success: true }, 0).0, Verdict::Unknown);
    let other_attempt = TrialRef { attempt: 7, ..t.clone() };
    assert_eq!(s.result("a", &other_attempt, ResultKind::Complete { success: true }, 0).0, Verdict::Unknown);
    let other_study = TrialRef { study: "nope".into(), ..t.clone() };
    assert_eq!(s.result("a", &other_study, ResultKind::Complete { success: true }, 0).0, Verdict::Unknown);
    let out_of_range = TrialRef { trial: 99, ..t.clone() };
    assert_eq!(s.result("a", &out_of_range, ResultKind::Complete { success: true }, 0).0, Verdict::Unknown);
    assert_eq!(s.result("a", &t, ResultKind::Complete { success: true }, 0).0, Verdict::Accepted);
}

/// A reference with the study's name but another
/// study id is of another study of that name (another store): none of
/// this study's results, progress, refusals or running attempts.
#[test]
fn a_reference_with_another_study_id_is_not_this_studys() {
    let mut s = sched(2, 3, Selector::default());
    assert_eq!(s.study_id("s"), Some(7));
    s.hello(info("a", 1, "x86_64", &[]));
    s.request("a", &req(1, 1));
    let t = assigned(&s.assign(0))[0].1.clone();
    assert_eq!(t.study_id, 7, "assignments carry the study's id");
    let twin = TrialRef { study_id: 8, ..t.clone() };
    assert!(s.is_live("a", &t) && !s.is_live("a", &twin));
    assert!(s.refuse("a", &twin, "no").is_empty(), "another study's refusal moves nothing");
    assert_eq!(s.result("a", &twin, ResultKind::Complete { success: true }, 0).0, Verdict::Unknown);
    assert_eq!(s.result("a", &t, ResultKind::Complete { success: true }, 0).0, Verdict::Accepted);
    assert_eq!(s.result("a", &t, ResultKind::Complete { success: true }, 0).0, Verdict::Duplicate);
    assert_eq!(s.result("a", &twin, ResultKind::Complete { success: true }, 0).0, Verdict::Unknown);
}

#[test]
fn retries_until_max_attempts_then_fails() {
    let mut s = sched(1, 2, Selector::default());
    s.hello(info("a", 1, "x86_64", &[]));
    for seq in 1..=2 {
        s.request("a", &req(seq, 1));
        let t = assigned(&s.assign(0))[0].1.clone();
        let (v, eff) = s.result("a", &t, ResultKind::Retry("no such program".into()), 0);
        assert_eq!(v, Verdict::Retried);
        if seq == 1 {
            assert!(matches!(&eff[..], [Effect::Requeued { .. }]));
        } else {
            assert!(matches!(&eff[..], [Effect::Failed { reason, .. }] if reason.contains("2 attempts")));
        }
    }
    assert_eq!(s.counts("s").map(|c| (c.failed, c.finished())), Some((1, true)));
}

#[test]
fn restarted_agent_loses_leases_and_expired_leases_are_cancelled() {
    let mut s = sched(2, 5, Selector::default());
    s.hello(info("a", 1, "x86_64", &[]));
    s.request("a", &req(1, 2));
    assert_eq!(assigned(&s.assign(0)).len(), 2);
    let eff = s.hello(info("a", 2, "x86_64", &[]));
    assert_eq!(eff.iter().filter(|e| matches!(e, Effect::Requeued { .. })).count(), 2);
    // The restarted agent's old retained status does not take it offline.
    assert!(s.status("a", &AgentStatus { online: false, instance: 1 }).is_empty());
    assert_eq!(s.live_agents(), 1);
    s.request("a", &req(1, 1));
    let t = assigned(&s.assign(100))[0].1.clone();
    assert!(s.expire(1_099).is_empty());
    let eff = s.expire(1_100);
    assert!(matches!(&eff[0], Effect::Cancel { trial, .. } if *trial == t));
    assert!(matches!(&eff[1], Effect::Requeued { .. }));
}

#[test]
fn refusal_requeues_without_counting_a_failure() {
    let mut s = sched(1, 1, Selector::default());
    s.hello(info("a", 1, "x86_64", &[]));
    s.request("a", &req(1, 1));
    let t = assigned(&s.assign(0))[0].1.clone();
    assert!(matches!(&s.refuse("a", &t, "busy")[..], [Effect::Requeued { .. }]));
    s.request("a", &req(2, 1));
    let t2 = assigned(&s.assign(0))[0].1.clone();
    assert_eq!(t2.attempt, 2);
    assert_eq!(s.result("a", &t2, ResultKind::Complete { success: true }, 0).0, Verdict::Accepted);
}

#[test]
fn work_spreads_round_robin() {
    let mut s = sched(4, 3, Selector::default());
    for a in ["a", "b"] {
        s.hello(info(a, 1, "x86_64", &[]));
        s.request(a, &req(1, 1));
    }
    let got = assigned(&s.assign(0));
    assert_eq!(got.len(), 2);
    assert_ne!(got[0].0, got[1].0);
}

#[test]
fn restored_running_trial_accepts_its_result() {
    let mut s = Scheduler::new();
    let policy = StudyPolicy { lease_ms: 10, ..policy("s", 7, 3, true) };
    let states = vec![Restored::Done, Restored::Running { agent: "a".into(), attempt: 2, failures: 1 }];
    s.add_study(policy, states, 0);
    let t = TrialRef { study: "s".into(), study_id: 7, trial: 1, attempt: 2 };
    assert_eq!(s.result("a", &t, ResultKind::Complete { success: true }, 0).0, Verdict::Accepted);
    assert!(s.counts("s").is_some_and(|c| c.finished()));
}

#[test]
fn restored_lease_not_listed_by_the_agent_is_requeued() {
    let mut s = Scheduler::new();
    let policy = StudyPolicy { lease_ms: 10_000, ..policy("s", 7, 3, true) };
    let states = vec![
        Restored::Running { agent: "a".into(), attempt: 1, failures: 0 },
        Restored::Running { agent: "a".into(), attempt: 1, failures: 0 },
        Restored::Running { agent: "gone".into(), attempt: 1, failures: 0 },
    ];
    s.add_study(policy, states, 0);
    s.hello(info("a", 9, "x86_64", &[]));
    let still = TrialRef { study: "s".into(), study_id: 7, trial: 0, attempt: 1 };
    let eff = s.request("a", &WorkRequest { seq: 1, free: 0, ahead: 0, running: vec![still.clone()], held: vec![] });
    assert!(matches!(&eff[..], [Effect::Requeued { trial, .. }] if trial.trial == 1), "{eff:?}");
    // The retained offline status of an agent this process never met releases its restored lease.
    let eff = s.status("gone", &AgentStatus { online: false, instance: 4 });
    assert!(matches!(&eff[..], [Effect::Requeued { trial, .. }] if trial.trial == 2), "{eff:?}");
    assert_eq!(s.result("a", &still, ResultKind::Complete { success: true }, 0).0, Verdict::Accepted);
}

/// Checks every index against a full scan of the trials and the agents.
fn assert_indexes_agree(s: &Scheduler) -> Result<(), proptest::test_runner::TestCaseError> {
    for study in &s.studies {
        let mut deadlines = BTreeSet::new();
        let mut held: HashMap<String, BTreeSet<u64>> = HashMap::new();
        for (i, t) in study.trials.iter().enumerate() {
            if let State::Running(l) = &t.state {
                deadlines.insert((l.deadline_ms, i as u64));
                held.entry(l.agent.clone()).or_default().insert(i as u64);
            }
        }
        let name = &study.policy.name;
        let ready_credit: u64 = s
            .agents
            .values()
            .filter(|a| a.online && a.info.as_ref().is_some_and(|i| study.policy.selector.matches(i)))
            .map(|a| u64::from(a.credit))
            .sum();
        prop_assert_eq!(study.ready_credit, ready_credit, "{}: credit of the agents that match", name);
        prop_assert_eq!(study.running(), deadlines.len() as u64, "{}: running count", name);
        prop_assert_eq!(&study.deadlines, &deadlines, "{}: leases by deadline", name);
        let nonempty = study.held.iter().filter(|(_, t)| !t.is_empty());
        prop_assert_eq!(
            nonempty.map(|(a, t)| (a.clone(), t.clone())).collect::<HashMap<_, _>>(),
            held,
            "{}: leases by agent",
            name
        );
    }
    let live = |a: &FleetAgent| a.online && a.info.is_some();
    let ready: BTreeSet<Arc<str>> =
        s.agents.values().filter(|a| live(a) && a.credit > 0).map(|a| a.name.clone()).collect();
    prop_assert_eq!(&s.ready, &ready, "agents with credit");
    prop_assert_eq!(s.live, s.agents.values().filter(|a| live(a)).count(), "live agents");
    prop_assert!(s.agents.values().all(|a| a.live == live(a)), "each agent's live flag");
    prop_assert!(s.agents.values().all(|a| a.ready == ready.contains(&a.name)), "each agent's ready flag");
    let counted = |a: &FleetAgent| if live(a) { a.credit } else { 0 };
    prop_assert!(s.agents.values().all(|a| a.counted == counted(a)), "each agent's counted credit");
    Ok(())
}

/// One event for the index property test.
#[derive(Debug, Clone)]
enum Op {
    Request { agent: usize, free: u32 },
    Complete { pick: usize, success: bool },
    Retry { pick: usize },
    Interfered { pick: usize },
    Refuse { pick: usize },
    Offline { agent: usize },
    Hello { agent: usize, restart: bool, gpu: bool },
    Overloaded { agent: usize, on: bool },
    Stop { study: bool, trial: u64 },
    AddTrial,
    Advance { ms: u64 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..4usize, 0..4u32).prop_map(|(agent, free)| Op::Request { agent, free }),
        3 => (any::<usize>(), any::<bool>()).prop_map(|(pick, success)| Op::Complete { pick, success }),
        1 => any::<usize>().prop_map(|pick| Op::Retry { pick }),
        1 => any::<usize>().prop_map(|pick| Op::Interfered { pick }),
        1 => any::<usize>().prop_map(|pick| Op::Refuse { pick }),
        1 => (0..4usize).prop_map(|agent| Op::Offline { agent }),
        1 => (0..4usize, any::<bool>(), any::<bool>())
            .prop_map(|(agent, restart, gpu)| Op::Hello { agent, restart, gpu }),
        1 => (0..4usize, any::<bool>()).prop_map(|(agent, on)| Op::Overloaded { agent, on }),
        1 => (any::<bool>(), 0..24u64).prop_map(|(study, trial)| Op::Stop { study, trial }),
        1 => Just(Op::AddTrial),
        2 => (0..1_500u64).prop_map(|ms| Op::Advance { ms }),
    ]
}

proptest! {
    /// After any sequence of events, on two studies sharing the agents
    /// (one restored with leases held by an agent this process has not
    /// met yet, and only for agents that say they have a GPU, which an
    /// agent may say or stop saying when it announces itself again),
    /// the indexes say what a scan of every trial and agent says.
    #[test]
    fn indexes_agree_with_a_full_scan_after_any_events(ops in proptest::collection::vec(op(), 1..200)) {
        let mut s = sched(12, 3, Selector::default());
        s.set_open("s", true);
        let gpu = Selector { tags: [("pool".to_string(), "gpu".to_string())].into(), ..Selector::default() };
        let policy = StudyPolicy { name: "t".into(), id: 8, selector: gpu, max_attempts: 2, ahead_per_slot: MAX_LOOKAHEAD_PER_SLOT, ahead_per_agent: None, lease_ms: 700, gpus: 0, store_share: u64::MAX };
        let mut states = vec![Restored::Pending { last_attempt: 0, failures: 0 }; 8];
        states.extend((1..4).map(|attempt| Restored::Running { agent: "d".into(), attempt, failures: 0 }));
        s.add_study(policy, states, 0);
        let agents = ["a", "b", "c", "d"];
        let mut instances = [1u64; 4];
        let mut seqs = [0u64; 4];
        for a in &agents[..3] {
            s.hello(info(a, 1, "x86_64", &[]));
        }
        assert_indexes_agree(&s)?;
        let mut held: Vec<(String, TrialRef)> = Vec::new();
        let mut now = 0u64;
        for op in ops {
            let pick = |held: &Vec<(String, TrialRef)>, p: usize| held.get(p % held.len().max(1)).cloned();
            match op {
                Op::Request { agent, free } => {
                    seqs[agent] += 1;
                    s.request(agents[agent], &WorkRequest { seq: seqs[agent], free, ahead: 0, running: vec![], held: vec![] });
                }
                Op::Complete { pick: p, success } => {
                    if let Some((a, t)) = pick(&held, p) {
                        s.result(&a, &t, ResultKind::Complete { success }, now);
                    }
                }
                Op::Retry { pick: p } => {
                    if let Some((a, t)) = pick(&held, p) {
                        s.result(&a, &t, ResultKind::Retry("x".into()), now);
                    }
                }
                Op::Interfered { pick: p } => {
                    if let Some((a, t)) = pick(&held, p) {
                        s.result(&a, &t, ResultKind::Interfered { success: true, reason: "load".into() }, now);
                    }
                }
                Op::Refuse { pick: p } => {
                    if let Some((a, t)) = pick(&held, p) {
                        s.refuse(&a, &t, "busy");
                    }
                }
                Op::Offline { agent } => {
                    s.status(agents[agent], &AgentStatus { online: false, instance: instances[agent] });
                }
                Op::Hello { agent, restart, gpu } => {
                    instances[agent] += u64::from(restart);
                    let tags: &[(&str, &str)] = if gpu { &[("pool", "gpu")] } else { &[] };
                    s.hello(info(agents[agent], instances[agent], "x86_64", tags));
                }
                Op::Overloaded { agent, on } => {
                    s.set_overloaded(agents[agent], on.then(|| "busy".to_string()), now);
                }
                Op::Stop { study, trial } => {
                    s.stop(if study { "s" } else { "t" }, trial, "enough");
                }
                Op::AddTrial => {
                    s.add_trial("s");
                }
                Op::Advance { ms } => {
                    now += ms;
                    s.expire(now);
                }
            }
            assert_indexes_agree(&s)?;
            for e in s.assign(now) {
                if let Effect::Assign { agent, trial, .. } = e {
                    held.push((agent, trial));
                }
            }
            assert_indexes_agree(&s)?;
        }
    }
}

#[test]
fn an_agent_with_lookahead_holds_one_trial_ahead_per_slot_of_studies_that_allow_it() {
    let mut s = Scheduler::new();
    let queue = |n| vec![Restored::Pending { last_attempt: 0, failures: 0 }; n];
    s.add_study(policy("strict", 7, 1, false), queue(10), 0);
    s.add_study(policy("ahead", 8, 1, true), queue(10), 0);
    s.hello(AgentInfo { slots: 1, lookahead: 1, ..info("a", 1, "x86_64", &[]) });
    // Asks for one slot and one place ahead; a thousand places is capped at two.
    s.request("a", &WorkRequest { seq: 1, free: 1_000, ahead: 1_000, running: vec![], held: vec![] });
    let first = assigned(&s.assign(0));
    assert_eq!(first.len(), 2, "one running, one held ahead: {first:?}");
    let studies: Vec<&str> = first.iter().map(|(_, t)| t.study.as_str()).collect();
    assert_eq!(studies, ["strict", "ahead"], "the strict study's trial takes the slot, never the place ahead");
    // Both held: nothing more, whatever it asks.
    let running = first.iter().map(|(_, t)| t.clone()).collect();
    s.request("a", &WorkRequest { seq: 2, free: 1, ahead: 1, running, held: vec![] });
    assert!(assigned(&s.assign(0)).is_empty(), "slot and place ahead both held");
    // The one held ahead has twice the lease: the running one expires alone.
    let expired = s.expire(1_000);
    let cancelled: Vec<&TrialRef> = expired
        .iter()
        .filter_map(|e| match e {
            Effect::Cancel { trial, .. } => Some(trial),
            _ => None,
        })
        .collect();
    assert_eq!(cancelled, [&first[0].1], "only the running trial's lease ran out at 1 s");
    assert_eq!(s.expire(2_000).len(), 2, "the held one's ran out at 2 s (cancel and requeue)");
}

#[test]
fn trials_held_deeper_than_a_slot_get_a_lease_for_each_trial_they_wait_behind() {
    let mut s = sched(10, 1, Selector::default());
    s.hello(AgentInfo { slots: 1, lookahead: 3, ..info("a", 1, "x86_64", &[]) });
    s.request("a", &WorkRequest { seq: 1, free: 1, ahead: 3, running: vec![], held: vec![] });
    let work = assigned(&s.assign(0));
    assert_eq!(work.len(), 4, "one running, three held behind one slot");
    // Leases of 1, 2, 3 and 4 s (the study's is 1 s): each expires alone.
    for (k, (_, trial)) in work.iter().enumerate() {
        let at = 1_000 * (k as u64 + 1);
        let cancelled: Vec<TrialRef> = s
            .expire(at)
            .into_iter()
            .filter_map(|e| match e {
                Effect::Cancel { trial, .. } => Some(trial),
                _ => None,
            })
            .collect();
        assert_eq!(cancelled, std::slice::from_ref(trial), "at {at} ms");
    }
    // An agent claiming more than four per slot is held to four.
    let mut s = sched(20, 1, Selector::default());
    s.hello(AgentInfo { slots: 1, lookahead: 9, ..info("a", 1, "x86_64", &[]) });
    s.request("a", &WorkRequest { seq: 1, free: 1, ahead: 9, running: vec![], held: vec![] });
    assert_eq!(assigned(&s.assign(0)).len(), 5);
}

/// A study whose search learns from each result (`tpe`, `gp`) has one of
/// its trials held ahead per slot at most, whatever the agent offers; a
/// study of another search beside it fills the other places.
#[test]
fn a_study_that_learns_from_each_result_is_held_one_deep_at_most() {
    let mut s = Scheduler::new();
    let queue = |n| vec![Restored::Pending { last_attempt: 0, failures: 0 }; n];
    s.add_study(StudyPolicy { ahead_per_slot: 1, ..policy("model", 7, 1, true) }, queue(20), 0);
    s.hello(AgentInfo { slots: 2, lookahead: 8, ..info("a", 1, "x86_64", &[]) });
    s.request("a", &WorkRequest { seq: 1, free: 2, ahead: 8, running: vec![], held: vec![] });
    let work = assigned(&s.assign(0));
    assert_eq!(work.len(), 4, "two running, one held per slot: {work:?}");
    s.add_study(policy("random", 8, 1, true), queue(20), 0);
    let running = work.iter().map(|(_, t)| t.clone()).collect();
    s.request("a", &WorkRequest { seq: 2, free: 0, ahead: 6, running, held: vec![] });
    let more = assigned(&s.assign(0));
    assert_eq!(more.len(), 6, "the other study fills the places left: {more:?}");
    assert!(more.iter().all(|(_, t)| t.study == "random"), "{more:?}");
    // What each may ask of its search: the model's study no more than it
    // could hand out (its slots and one ahead each), the other all offered.
    let mut s = Scheduler::new();
    s.add_study(StudyPolicy { ahead_per_slot: 1, ..policy("model", 7, 1, true) }, Vec::new(), 0);
    s.add_study(policy("random", 8, 1, true), Vec::new(), 0);
    s.hello(AgentInfo { slots: 2, lookahead: 8, ..info("a", 1, "x86_64", &[]) });
    s.request("a", &WorkRequest { seq: 1, free: 2, ahead: 8, running: vec![], held: vec![] });
    assert_eq!((s.demand("model"), s.demand("random")), (4, 10));
    // Another study's held trials take the agent's places, not the
    // model's depth: an agent kept full by a random study still takes the
    // model's trials as its places free, in turn with the other study.
    let mut s = Scheduler::new();
    s.add_study(policy("random", 8, 1, true), queue(50), 0);
    s.hello(AgentInfo { slots: 1, lookahead: 4, ..info("a", 1, "x86_64", &[]) });
    s.request("a", &WorkRequest { seq: 1, free: 1, ahead: 4, running: vec![], held: vec![] });
    let mut out: Vec<TrialRef> = assigned(&s.assign(0)).into_iter().map(|(_, t)| t).collect();
    assert_eq!(out.len(), 5);
    s.add_study(StudyPolicy { ahead_per_slot: 1, ..policy("model", 7, 1, true) }, queue(20), 0);
    let mut models = 0;
    for seq in 2..12 {
        let done = out.remove(0);
        assert_eq!(s.result("a", &done, ResultKind::Complete { success: true }, 0).0, Verdict::Accepted);
        s.request("a", &WorkRequest { seq, free: 0, ahead: 1, running: vec![], held: out.clone() });
        let next = assigned(&s.assign(0));
        assert_eq!(next.len(), 1, "a place freed, a trial given");
        models += usize::from(next[0].1.study == "model");
        out.extend(next.into_iter().map(|(_, t)| t));
        let own = out.iter().filter(|t| t.study == "model").count();
        assert!(own <= 2, "the model's trials: one running at most and one held per slot ({own})");
    }
    assert!(models >= 2, "the model's study got {models} of 10 places");
}

/// A study that learns from each result has one of its trials
/// held per agent, not per slot, so its search is asked just in time.
#[test]
fn a_study_that_learns_from_each_result_is_held_one_per_agent() {
    let mut s = Scheduler::new();
    let queue = |n| vec![Restored::Pending { last_attempt: 0, failures: 0 }; n];
    let model = StudyPolicy { ahead_per_slot: 1, ahead_per_agent: Some(1), ..policy("model", 7, 1, true) };
    s.add_study(model.clone(), Vec::new(), 0);
    s.hello(AgentInfo { slots: 4, lookahead: 8, ..info("a", 1, "x86_64", &[]) });
    s.request("a", &WorkRequest { seq: 1, free: 4, ahead: 8, running: vec![], held: vec![] });
    assert_eq!(s.demand("model"), 5, "four slots and one held: what the search may be asked");
    let mut s = Scheduler::new();
    s.add_study(model, queue(20), 0);
    s.hello(AgentInfo { slots: 4, lookahead: 8, ..info("a", 1, "x86_64", &[]) });
    s.request("a", &WorkRequest { seq: 1, free: 4, ahead: 8, running: vec![], held: vec![] });
    let work = assigned(&s.assign(0));
    assert_eq!(work.len(), 5, "four running, one held: {work:?}");
    assert_eq!(work.iter().filter(|(_, t)| t.study == "model").count(), 5);
}

#[test]
fn without_lookahead_a_busy_agent_gets_nothing_ahead() {
    let mut s = sched(10, 1, Selector::default());
    s.hello(AgentInfo { slots: 1, lookahead: 0, ..info("a", 1, "x86_64", &[]) });
    s.request("a", &WorkRequest { seq: 1, free: 1, ahead: 5, running: vec![], held: vec![] });
    assert_eq!(assigned(&s.assign(0)).len(), 1, "an agent that announced no lookahead takes its slots only");
    // A study with `lookahead = 0` alone: an agent that offers a place
    // ahead still gets only its slot.
    let mut s = Scheduler::new();
    let policy = policy("s", 7, 1, false);
    s.add_study(policy, vec![Restored::Pending { last_attempt: 0, failures: 0 }; 10], 0);
    s.hello(AgentInfo { slots: 1, lookahead: 1, ..info("a", 1, "x86_64", &[]) });
    s.request("a", &WorkRequest { seq: 1, free: 1, ahead: 1, running: vec![], held: vec![] });
    assert_eq!(assigned(&s.assign(0)).len(), 1, "the study's trials never wait on an agent");
}

#[test]
fn a_held_trial_whose_lease_ended_is_cancelled_on_the_agent_and_one_still_leased_is_kept() {
    let mut s = sched(4, 3, Selector::default());
    s.hello(AgentInfo { slots: 1, lookahead: 1, ..info("a", 1, "x86_64", &[]) });
    s.request("a", &WorkRequest { seq: 1, free: 1, ahead: 1, running: vec![], held: vec![] });
    let got = assigned(&s.assign(0));
    let (run, held) = (got[0].1.clone(), got[1].1.clone());
    // Still leased: nothing to cancel.
    let kept = s
        .request("a", &WorkRequest { seq: 2, free: 0, ahead: 0, running: vec![run.clone()], held: vec![held.clone()] });
    assert!(kept.is_empty(), "{kept:?}");
    // Its lease ends (it went offline), it comes back still holding the trial.
    s.status("a", &AgentStatus { online: false, instance: 1 });
    s.status("a", &AgentStatus { online: true, instance: 1 });
    let back = s
        .request("a", &WorkRequest { seq: 3, free: 0, ahead: 0, running: vec![run.clone()], held: vec![held.clone()] });
    let cancelled: Vec<&TrialRef> = back
        .iter()
        .filter_map(|e| match e {
            Effect::Cancel { agent, trial, .. } if agent == "a" => Some(trial),
            _ => None,
        })
        .collect();
    assert_eq!(cancelled, [&held], "only the held one: a running one's late result may still count");
}

#[test]
fn a_result_is_awaited_from_a_live_attempt_and_from_a_stopped_one_not_yet_delivered() {
    let mut s = sched(2, 1, Selector::default());
    s.hello(AgentInfo { slots: 2, ..info("a", 1, "x86_64", &[]) });
    s.request("a", &req(1, 2));
    let work = assigned(&s.assign(0));
    let (t0, t1) = (work[0].1.clone(), work[1].1.clone());
    assert!(s.awaits_result("a", &t0) && !s.awaits_result("b", &t0));
    assert!(!s.awaits_result("a", &TrialRef { attempt: t0.attempt + 1, ..t0.clone() }), "another attempt");
    s.stop("s", t0.trial, "ASHA");
    assert!(s.awaits_result("a", &t0), "stopped early, its result still to come (kept for the record)");
    s.result("a", &t0, ResultKind::Complete { success: true }, 0);
    assert!(!s.awaits_result("a", &t0), "delivered");
    s.result("a", &t1, ResultKind::Complete { success: true }, 0);
    assert!(!s.awaits_result("a", &t1), "done");
}

/// A member announcing the most slots took nearly
/// every pending trial, and each time it went offline every trial it held
/// (none started) counted a failed attempt.
#[test]
fn regression_trials_lost_before_they_start_never_fail_and_the_loser_is_given_fewer() {
    let mut s = sched(40, 2, Selector::default());
    s.hello(AgentInfo { slots: 4, lookahead: 16, ..info("m", 1, "x86_64", &[]) });
    for round in 1..=5u64 {
        let ask = WorkRequest { seq: round, free: 4, ahead: 16, running: vec![], held: vec![] };
        s.request("m", &ask);
        let got = assigned(&s.assign(0)).len();
        let eff = s.status("m", &AgentStatus { online: false, instance: 1 });
        assert!(!eff.iter().any(|e| matches!(e, Effect::Failed { .. })), "round {round}: {eff:?}");
        let requeued: Vec<_> = eff.iter().filter(|e| matches!(e, Effect::Requeued { .. })).collect();
        assert_eq!(requeued.len(), got, "every trial it held is queued again");
        assert!(requeued
            .iter()
            .all(|e| matches!(e, Effect::Requeued { reason, .. } if reason.starts_with(NOT_STARTED))));
        let lost = eff.iter().find_map(|e| match e {
            Effect::LostHeld { agent, trials, places } if agent == "m" => Some((*trials, *places)),
            _ => None,
        });
        assert_eq!(lost.map(|l| l.0), Some(got as u32), "round {round}");
        s.hello(AgentInfo { slots: 4, lookahead: 16, ..info("m", 1, "x86_64", &[]) });
    }
    assert_eq!(s.counts("s").map(|c| c.failed), Some(0));
    // Five losses: it may hold one trial at once now, and earns places back with results.
    assert_eq!(s.reliability("m"), Some((20 + 10 + 5 + 2 + 1, 1)));
    s.request("m", &WorkRequest { seq: 9, free: 4, ahead: 16, running: vec![], held: vec![] });
    let t = assigned(&s.assign(0));
    assert_eq!(t.len(), 1, "its window is one trial");
    s.started("m", &t[0].1);
    assert_eq!(s.result("m", &t[0].1, ResultKind::Complete { success: true }, 0).0, Verdict::Accepted);
    assert_eq!(s.reliability("m").map(|r| r.1), Some(2));
    // A started attempt lost is a failed attempt, as before.
    s.request("m", &WorkRequest { seq: 10, free: 4, ahead: 16, running: vec![], held: vec![] });
    let t = assigned(&s.assign(0));
    s.request("m", &WorkRequest { seq: 11, free: 2, ahead: 0, running: vec![t[0].1.clone()], held: vec![] });
    let eff = s.status("m", &AgentStatus { online: false, instance: 1 });
    assert_eq!(
        eff.iter().filter(|e| matches!(e, Effect::Requeued { reason, .. } if !reason.starts_with(NOT_STARTED))).count(),
        1,
        "{eff:?}"
    );
}

/// Pending trials are shared among the agents that ask, one
/// each in turn, and an agent holds trials ahead only up to its share of
/// what is outstanding while others are live.
#[test]
fn regression_no_agent_drains_the_queue_while_others_wait() {
    let mut s = sched(30, 3, Selector::default());
    s.hello(AgentInfo { slots: 4, lookahead: 16, ..info("greedy", 1, "x86_64", &[]) });
    s.hello(AgentInfo { slots: 1, lookahead: 0, ..info("h1", 1, "x86_64", &[]) });
    s.hello(AgentInfo { slots: 1, lookahead: 0, ..info("h2", 1, "x86_64", &[]) });
    s.request("greedy", &WorkRequest { seq: 1, free: 4, ahead: 16, running: vec![], held: vec![] });
    let got = assigned(&s.assign(0));
    // 30 outstanding among 3 live agents: at most 10 for the greedy one.
    assert_eq!(got.len(), 10, "{got:?}");
    s.request("h1", &req(1, 1));
    s.request("h2", &req(1, 1));
    let got = assigned(&s.assign(0));
    assert_eq!(got.iter().map(|g| g.0.as_str()).collect::<Vec<_>>().len(), 2);
    assert!(got.iter().any(|g| g.0 == "h1") && got.iter().any(|g| g.0 == "h2"), "{got:?}");
    // Alone, an agent may hold as deep as it asks.
    let mut alone = sched(30, 3, Selector::default());
    alone.hello(AgentInfo { slots: 4, lookahead: 16, ..info("a", 1, "x86_64", &[]) });
    alone.request("a", &WorkRequest { seq: 1, free: 4, ahead: 16, running: vec![], held: vec![] });
    assert_eq!(assigned(&alone.assign(0)).len(), 20);
    // Two agents asking at once are served in turn, not one after the other.
    let mut both = sched(4, 3, Selector::default());
    both.hello(AgentInfo { slots: 4, ..info("a", 1, "x86_64", &[]) });
    both.hello(AgentInfo { slots: 4, ..info("b", 1, "x86_64", &[]) });
    both.request("a", &req(1, 4));
    both.request("b", &req(1, 4));
    let got = assigned(&both.assign(0));
    assert_eq!(got.iter().filter(|g| g.0 == "a").count(), 2, "{got:?}");
    assert_eq!(got.iter().filter(|g| g.0 == "b").count(), 2, "{got:?}");
}

/// Every lease a member hoarded opened a
/// co-measurement window on every node. A trial held ahead now says it
/// started ([`Effect::Started`]) only once its agent runs it, and only then
/// are its nodes started; a trial into a free slot starts at once.
#[test]
fn regression_a_held_trial_says_it_started_once_its_agent_runs_it() {
    let mut s = sched(4, 3, Selector::default());
    s.hello(AgentInfo { slots: 1, lookahead: 2, ..info("a", 1, "x86_64", &[]) });
    s.request("a", &WorkRequest { seq: 1, free: 1, ahead: 2, running: vec![], held: vec![] });
    let eff = s.assign(0);
    let ahead: Vec<(TrialRef, bool)> = eff
        .iter()
        .filter_map(|e| match e {
            Effect::Assign { trial, ahead, .. } => Some((trial.clone(), *ahead)),
            _ => None,
        })
        .collect();
    assert_eq!(ahead.iter().map(|a| a.1).collect::<Vec<_>>(), vec![false, true, true], "{ahead:?}");
    let (first, held) = (ahead[0].0.clone(), ahead[1].0.clone());
    // Listed as held: not started, nothing to say.
    let eff = s.request(
        "a",
        &WorkRequest { seq: 2, free: 0, ahead: 0, running: vec![first.clone()], held: vec![held.clone()] },
    );
    assert!(!eff.iter().any(|e| matches!(e, Effect::Started { .. })), "{eff:?}");
    // Now running: said once.
    let eff = s.request("a", &WorkRequest { seq: 3, free: 0, ahead: 1, running: vec![held.clone()], held: vec![] });
    assert!(matches!(&eff[..], [Effect::Started { trial, .. }] if *trial == held), "{eff:?}");
    let eff = s.request("a", &WorkRequest { seq: 4, free: 0, ahead: 1, running: vec![held.clone()], held: vec![] });
    assert!(!eff.iter().any(|e| matches!(e, Effect::Started { .. })), "once: {eff:?}");
}

/// An agent past its share of a study's store is refused and
/// given none of its trials; the trial goes to another, the study waits
/// with a reason once no agent has room left.
#[test]
fn an_agent_past_its_share_of_the_store_gets_no_more_trials_and_its_result_goes_elsewhere() {
    let mut s = Scheduler::new();
    let queue = vec![Restored::Pending { last_attempt: 0, failures: 0 }; 4];
    s.add_study(StudyPolicy { store_share: 1_000, ..policy("s", 7, 3, false) }, queue, 0);
    s.hello(info("a", 1, "x86_64", &[]));
    s.request("a", &req(1, 2));
    let given = assigned(&s.assign(0));
    assert_eq!(given.len(), 2);
    assert_eq!(s.count_written("a", &given[0].1, 600), None, "within its share");
    assert_eq!(s.count_written("a", &given[0].1, 600), Some(1_000), "past it: said once");
    assert_eq!(s.count_written("a", &given[0].1, 10), None);
    assert!(s.take_progress("a", &given[1].1, 10).is_err(), "its progress is refused");
    let (verdict, _) = s.result("a", &given[1].1, ResultKind::Complete { success: true }, 0);
    assert_eq!(verdict, Verdict::PastShare);
    assert!(s.why_waiting("s").is_some_and(|w| w.contains("share of its store")), "{:?}", s.why_waiting("s"));
    s.request("a", &req(2, 2));
    assert!(assigned(&s.assign(0)).is_empty(), "past its share: nothing more for it");
    // Another agent takes the trial back and the rest.
    s.hello(info("b", 1, "x86_64", &[]));
    s.request("b", &req(1, 2));
    let to_b = assigned(&s.assign(0));
    assert!(to_b.iter().any(|(_, t)| t.trial == given[1].1.trial), "the refused trial went to b: {to_b:?}");
    assert_eq!(s.why_waiting("s"), None);
}

/// Store space per token as well as per name: the names of a
/// token with a share of its own are past it together, whatever each
/// wrote alone; what a name wrote before its token was known counts too.
#[test]
fn a_tokens_names_share_its_store_grant() {
    let mut s = Scheduler::new();
    let queue = vec![Restored::Pending { last_attempt: 0, failures: 0 }; 6];
    s.add_study(StudyPolicy { store_share: 10_000, ..policy("s", 7, 3, false) }, queue, 0);
    for name in ["a", "b", "c"] {
        s.hello(info(name, 1, "x86_64", &[]));
        s.request(name, &req(1, 2));
    }
    let given = assigned(&s.assign(0));
    let of = |agent: &str| given.iter().find(|(a, _)| a == agent).map(|(_, t)| t.clone()).expect("a trial");
    // `a` wrote 400 bytes before its Hello said which token it is.
    assert_eq!(s.count_written("a", &of("a"), 400), None);
    s.set_holder("a", "token t1", 1_000);
    s.set_holder("b", "token t1", 1_000);
    assert_eq!(s.count_written("b", &of("b"), 500), None, "900 of the token's 1,000");
    assert_eq!(s.count_written("b", &of("b"), 200), Some(1_000), "1,100: past the token's share");
    assert!(s.take_progress("a", &of("a"), 10).is_err(), "a's too, though it wrote 400 alone");
    assert_eq!(s.count_written("c", &of("c"), 2_000), None, "another name's own share is its own");
    s.request("a", &req(2, 2));
    s.request("c", &req(2, 2));
    let next = assigned(&s.assign(0));
    assert!(next.iter().all(|(a, _)| a == "c"), "nothing more for the token's names: {next:?}");
}
