//! The spool's tests: round trip, group commit, torn tails, a crash between
//! an append and its ack, compaction, the earlier layout, parking.

use super::log::{replay, should_compact, CHUNK, COMPACT_ABOVE, COMPACT_SETTLED, MAGIC};
use super::*;
use tunefleet_common::measurement::{
    AppliedLimits, EnergyReading, EnergySourceKind, ExitOutcome, Measurement, MemoryLimit,
};

fn result(study: &str, trial: u64) -> TrialResult {
    TrialResult {
        trial: TrialRef { study: study.into(), study_id: 7, trial, attempt: 1 },
        measurement: Measurement {
            started_unix_ms: 5,
            wall_us: 7,
            max_rss_kib: 3,
            energy: EnergyReading { joules: 1.5, valid: true, ..EnergyReading::none(EnergySourceKind::Estimated, "") },
            limits: AppliedLimits { cpus: vec![1], threads: Some(2), memory: MemoryLimit::None },
            log_tail: "x\n".into(),
            ..Measurement::unmeasured(ExitOutcome::Cancelled, EnergyReading::none(EnergySourceKind::Estimated, ""))
        },
    }
}

/// A new state directory and the spool opened in it.
fn fresh() -> (tempfile::TempDir, PendingResults) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = reopen(dir.path());
    (dir, store)
}

/// A spool holding the results of trials 1 and 2 of `study`.
fn holding_two(study: &str) -> (tempfile::TempDir, PendingResults, TrialResult, TrialResult) {
    let (dir, mut store) = fresh();
    let (a, b) = (result(study, 1), result(study, 2));
    store.save(&a).expect("save");
    store.save(&b).expect("save");
    (dir, store, a, b)
}

/// What the spool of `dir` holds, opened anew (the agent restarted).
/// Another test of this process forking at the moment the lock's file is
/// open hands its child a copy of the descriptor until the child's exec
/// closes it: the lock is waited for briefly, as a restarted agent finds
/// it free once the old process is gone.
fn reopened(dir: &Path) -> Vec<TrialResult> {
    reopen(dir).load()
}

/// The spool of `dir` opened (again), waiting out such a brief lock.
fn reopen(dir: &Path) -> PendingResults {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match PendingResults::open(dir) {
            // Waiting for a condition (the forked child's exec) nothing announces.
            Err(PendingError::Locked(_)) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            other => return other.expect("reopen"),
        }
    }
}

fn log_path(dir: &Path) -> PathBuf {
    dir.join(LOG)
}

fn log_len(dir: &Path) -> u64 {
    fs::metadata(log_path(dir)).expect("log").len()
}

/// Where the records of the log in `dir` end (zeros follow, to the file's end).
fn records_end(dir: &Path) -> usize {
    let bytes = fs::read(log_path(dir)).expect("read");
    let r = replay(&bytes);
    assert!(r.dropped.is_none(), "{:?}", r.dropped);
    assert!(bytes[r.valid_len..].iter().all(|&b| b == 0), "zeros after the records");
    r.valid_len
}

/// Writes zeros over `from..to` of the log in `dir`: what a crash leaves of
/// bytes written there but never synced (the file was made with zeros ahead).
fn zero(dir: &Path, from: usize, to: usize) {
    let mut bytes = fs::read(log_path(dir)).expect("read");
    assert!(bytes[from..to].iter().any(|&b| b != 0), "something to lose");
    bytes[from..to].fill(0);
    fs::write(log_path(dir), &bytes).expect("write");
}

/// The log file of `dir` is `records`, then zeros to a whole chunk.
fn assert_log_is(dir: &Path, records: &[u8]) {
    let bytes = fs::read(log_path(dir)).expect("read");
    assert_eq!(&bytes[..records.len()], records);
    assert!(bytes[records.len()..].iter().all(|&b| b == 0));
    assert_eq!(bytes.len() as u64 % CHUNK, 0, "made a chunk at a time");
}

#[test]
fn saves_loads_and_removes() {
    let (dir, mut store, a, b) = holding_two("st/../x");
    assert_eq!(store.load(), vec![a.clone(), b.clone()]);
    assert_eq!(SpoolView::open(dir.path()).load(), vec![a.clone(), b.clone()], "seen beside the agent");
    store.remove(&a.trial).expect("remove");
    store.remove(&a.trial).expect("removing twice is fine");
    assert_eq!(store.load(), vec![b.clone()]);
    drop(store);
    assert_eq!(reopened(dir.path()), vec![b]);
    assert!(!dir.path().join(INBOX).exists(), "no file per result");
    assert_ne!(file_name(&a.trial), file_name(&result("st_.._x", 1).trial));
}

#[test]
fn results_kept_together_take_one_sync() {
    let (dir, mut store) = fresh();
    let results: Vec<TrialResult> = (0..4).map(|t| result("g", t)).collect();
    store.save_all(&results.iter().collect::<Vec<_>>()).expect("save all");
    assert_eq!(store.log.syncs(), 1, "one fdatasync for the group");
    store.save(&result("g", 9)).expect("save");
    assert_eq!(store.log.syncs(), 2);
    store.remove(&results[0].trial).expect("ack");
    assert_eq!(store.log.syncs(), 2, "an ack mark is made durable by the next append");
    drop(store);
    assert_eq!(reopened(dir.path()).len(), 4);
}

#[test]
fn a_torn_last_record_is_dropped_and_the_rest_kept() {
    // A crash during b's write: its record cut short, the rest of it left
    // as the zeros made ahead, or the file itself shorter.
    for (cut, truncated) in [(7usize, false), (30, false), (1, true), (7, true), (30, true)] {
        let (dir, store, a, _) = holding_two("t");
        let c = result("t", 3);
        drop(store);
        let end = records_end(dir.path());
        if truncated {
            fs::OpenOptions::new()
                .write(true)
                .open(log_path(dir.path()))
                .and_then(|f| f.set_len((end - cut) as u64))
                .expect("cut");
        } else {
            zero(dir.path(), end - cut, end);
        }
        let mut store = reopen(dir.path());
        assert_eq!(store.load(), vec![a.clone()], "cut {cut}");
        // Appends after it are read back: the torn bytes are gone.
        store.save(&c).expect("save");
        drop(store);
        assert_eq!(reopened(dir.path()), vec![a, c], "cut {cut}");
    }
}

#[test]
fn a_last_record_with_a_bad_checksum_is_dropped() {
    let (dir, store, a, _) = holding_two("t");
    drop(store);
    let end = records_end(dir.path());
    let mut bytes = fs::read(log_path(dir.path())).expect("read");
    bytes[end - 3] ^= 0x40;
    fs::write(log_path(dir.path()), &bytes).expect("write");
    let r = replay(&bytes);
    assert_eq!(r.dropped.as_ref().map(|d| d.why), Some("a record whose checksum does not match (torn write)"));
    assert_eq!(reopened(dir.path()), vec![a]);
}

/// An append changes neither the file's size nor its blocks (its sync
/// writes the record alone, not the inode); the file grows a chunk at a
/// time, and a log of an earlier version (no zeros after its records)
/// is read as it is and grows so from its next append.
#[test]
fn appends_go_into_zeros_made_ahead_a_chunk_at_a_time() {
    let (dir, mut store) = fresh();
    assert_eq!(log_len(dir.path()), CHUNK, "a new log is one chunk");
    let mut trial = 0;
    while (records_end(dir.path()) as u64) < CHUNK - 4096 {
        store.save(&result("z", trial)).expect("save");
        assert_eq!(log_len(dir.path()), CHUNK, "an append within the chunk keeps the size");
        trial += 1;
    }
    while (records_end(dir.path()) as u64) < CHUNK + 1 {
        store.save(&result("z", trial)).expect("save");
        trial += 1;
    }
    assert_eq!(log_len(dir.path()), 2 * CHUNK, "the next chunk, zeros ahead");
    drop(store);
    assert_eq!(reopened(dir.path()).len() as u64, trial);
    // The records alone, as an earlier version left them.
    let end = records_end(dir.path());
    fs::OpenOptions::new()
        .write(true)
        .open(log_path(dir.path()))
        .and_then(|f| f.set_len(end as u64))
        .expect("cut the zeros");
    let mut store = reopen(dir.path());
    assert_eq!(store.load().len() as u64, trial);
    store.save(&result("z", trial)).expect("save");
    assert_eq!(log_len(dir.path()) % CHUNK, 0, "grown to a whole chunk");
    drop(store);
    assert_eq!(reopened(dir.path()).len() as u64, trial + 1);
}

#[test]
fn a_crash_between_the_append_and_the_ack_sends_the_result_again() {
    let (dir, mut store) = fresh();
    let (a, b) = (result("c", 1), result("c", 2));
    store.save(&a).expect("save");
    let before_ack = records_end(dir.path());
    // Killed after the append, before any ack: the result is there.
    drop(store);
    let mut store = reopen(dir.path());
    assert_eq!(store.load(), vec![a.clone()]);
    // Acked, then a power cut loses the unsynced ack mark: sent again (the
    // coordinator answers Duplicate), never lost.
    store.save(&b).expect("save");
    let synced = records_end(dir.path());
    store.remove(&a.trial).expect("ack");
    let end = records_end(dir.path());
    assert!(end > synced, "the ack mark appended");
    drop(store);
    zero(dir.path(), synced, end);
    assert!(synced > before_ack);
    assert_eq!(reopened(dir.path()), vec![a.clone(), b.clone()]);
    // With the ack kept, it is gone for good.
    let mut store = reopen(dir.path());
    store.remove(&a.trial).expect("ack");
    drop(store);
    assert_eq!(reopened(dir.path()), vec![b]);
}

#[test]
fn the_log_is_compacted_once_everything_in_it_is_acknowledged() {
    let (dir, mut store) = fresh();
    let mut peak = 0;
    let mut trial = 0;
    // Each trial saved and acked: the log grows until it passes the bound,
    // then is rewritten empty.
    loop {
        let r = result("k", trial);
        store.save(&r).expect("save");
        store.remove(&r.trial).expect("ack");
        let len = store.log.len();
        assert_eq!(len, records_end(dir.path()) as u64);
        if len < peak {
            break;
        }
        peak = len;
        trial += 1;
        assert!(trial < 10_000, "never compacted");
    }
    assert!(peak >= COMPACT_SETTLED - 1024, "{peak}");
    assert_log_is(dir.path(), MAGIC);
    assert_eq!(records_end(dir.path()), MAGIC.len(), "nothing acknowledged kept");
    assert!(!dir.path().join("spool.log.tmp").exists());
    // With one result unacknowledged, the log is not rewritten at that size.
    let held = result("k", 100_000);
    store.save(&held).expect("save");
    for t in 0..=trial + 1 {
        let r = result("k", t);
        store.save(&r).expect("save");
        store.remove(&r.trial).expect("ack");
    }
    assert!(store.log.len() > COMPACT_SETTLED, "kept while something is unacknowledged");
    drop(store);
    // Reopened, it is rewritten with the unacknowledged result alone.
    let store = reopen(dir.path());
    assert_eq!(store.load(), vec![held.clone()]);
    let mut alone = MAGIC.to_vec();
    log::push_result(&mut alone, &file_name(&held.trial), &encode(&held).expect("encode")).expect("frame");
    assert_log_is(dir.path(), &alone);
    assert_eq!(records_end(dir.path()), alone.len());
}

#[test]
fn compaction_thresholds() {
    assert!(!should_compact(COMPACT_SETTLED - 1, 0, 0));
    assert!(should_compact(COMPACT_SETTLED, 0, 0));
    assert!(!should_compact(COMPACT_SETTLED * 2, 1, 100), "something unacknowledged, under the bound");
    assert!(should_compact(COMPACT_ABOVE, 10, COMPACT_ABOVE / 2));
    assert!(
        !should_compact(COMPACT_ABOVE, 10, COMPACT_ABOVE / 2 + 1),
        "mostly unacknowledged: rewriting would gain little"
    );
}

#[test]
fn results_of_the_earlier_layout_are_moved_into_the_log() {
    let dir = tempfile::tempdir().expect("tempdir");
    let inbox = dir.path().join(INBOX);
    fs::create_dir_all(&inbox).expect("mkdir");
    let (a, b) = (result("old", 1), result("old", 2));
    for r in [&a, &b] {
        fs::write(inbox.join(file_name(&r.trial)), encode(r).expect("encode")).expect("write");
    }
    fs::write(inbox.join("junk.bin"), b"\x01\xff").expect("write junk");
    assert_eq!(SpoolView::open(dir.path()).load(), vec![a.clone(), b.clone()], "listed before the agent starts");
    let mut store = reopen(dir.path());
    assert_eq!(store.load(), vec![a.clone(), b.clone()]);
    let left: Vec<String> =
        fs::read_dir(&inbox).expect("dir").flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    assert_eq!(left, vec!["junk.bin".to_string()], "moved ones removed, unreadable ones left");
    store.remove(&a.trial).expect("ack");
    drop(store);
    assert_eq!(reopened(dir.path()), vec![b], "read once");
}

#[test]
fn results_an_older_protocol_version_stored_are_still_read_and_others_are_left() {
    let dir = tempfile::tempdir().expect("tempdir");
    let inbox = dir.path().join(INBOX);
    fs::create_dir_all(&inbox).expect("mkdir");
    let (a, b) = (result("old", 1), result("old", 2));
    // Versions 8 to 12 encoded a result as this version does without its
    // GPU readings and CPU share (the last two bytes here: an empty list,
    // None); 7 did not.
    let with_version = |r: &TrialResult, v: u8| {
        assert!(r.measurement.gpus.is_empty() && r.measurement.cpu_share.is_none());
        let mut bytes = encode(r).expect("encode");
        assert_eq!(bytes.split_off(bytes.len() - 2), [0, 0], "they end it");
        bytes[0] = v;
        bytes
    };
    fs::write(inbox.join(file_name(&a.trial)), with_version(&a, 8)).expect("write");
    fs::write(inbox.join(file_name(&b.trial)), with_version(&b, 7)).expect("write");
    let store = reopen(dir.path());
    assert_eq!(store.load(), vec![a.clone()], "the version-8 result is read (and would be sent in this version)");
    drop(store);
    assert_eq!(reopened(dir.path()), vec![a], "and kept in the log");
    assert!(inbox.join(file_name(&b.trial)).exists(), "an unreadable version stays where it was");
}

#[test]
fn one_agent_per_state_directory() {
    let (dir, store) = fresh();
    assert!(matches!(PendingResults::open(dir.path()), Err(PendingError::Locked(_))));
    drop(store);
    drop(reopen(dir.path())); // free once the first is gone
}

#[test]
fn a_file_that_is_not_a_spool_log_is_moved_aside() {
    let dir = tempfile::tempdir().expect("tempdir");
    fs::write(log_path(dir.path()), b"something else").expect("write");
    let mut store = reopen(dir.path());
    assert!(store.load().is_empty());
    assert_eq!(fs::read(dir.path().join("spool.log.unreadable")).expect("aside"), b"something else");
    let a = result("n", 1);
    store.save(&a).expect("save");
    drop(store);
    assert_eq!(reopened(dir.path()), vec![a]);
}

#[test]
fn refused_results_are_parked_listed_and_requeued() {
    let (dir, mut store) = fresh();
    let view = SpoolView::open(dir.path());
    let (a, b) = (result("other", 1), result("mine", 2));
    store.save(&a).expect("save");
    store.save(&b).expect("save");
    store.park(&a.trial, "this coordinator does not run that study").expect("park");
    assert_eq!(store.load(), vec![b.clone()], "parked results are not sent again");
    let parked = view.parked();
    assert_eq!(parked.len(), 1);
    assert_eq!(parked[0].trial, a.trial);
    assert_eq!(parked[0].reason, "this coordinator does not run that study");
    drop(store);
    assert_eq!(view.requeue().expect("requeue"), 1);
    assert!(view.parked().is_empty());
    assert_eq!(view.load(), vec![b.clone(), a.clone()]);
    assert_eq!(reopened(dir.path()), vec![b, a], "delivered on the next run");
}

#[test]
fn regression_parking_never_overwrites_a_parked_result() {
    let (dir, mut store) = fresh();
    let view = SpoolView::open(dir.path());
    let first = result("exp", 3);
    let mut second = result("exp", 3);
    second.measurement.wall_us = 99;
    store.save(&first).expect("save");
    store.park(&first.trial, "first refusal").expect("park");
    // The same trial reference, refused again (another store's study of that name).
    store.save(&second).expect("save");
    store.park(&second.trial, "second refusal").expect("park");
    let parked = view.parked();
    assert_eq!(parked.len(), 2, "both kept: {parked:?}");
    let mut reasons: Vec<&str> = parked.iter().map(|p| p.reason.as_str()).collect();
    reasons.sort_unstable();
    assert_eq!(reasons, ["first refusal", "second refusal"]);
    let walls: Vec<u64> = parked
        .iter()
        .map(|p| decode_stored_result(&fs::read(&p.path).expect("read")).expect("decode").measurement.wall_us)
        .collect();
    assert!(walls.contains(&7) && walls.contains(&99), "{walls:?}");
    assert!(store.load().is_empty());
    drop(store);
    // Requeued: one goes back; the other would overwrite it and stays parked.
    assert_eq!(view.requeue().expect("requeue"), 1);
    assert_eq!(view.load().len(), 1);
    assert_eq!(view.parked().len(), 1, "never written over");
    // Once the first is in the log, requeueing again leaves the second parked too.
    let store = reopen(dir.path());
    assert_eq!(store.load().len(), 1);
    assert_eq!(view.requeue().expect("requeue"), 0);
    assert_eq!(view.parked().len(), 1);
}

#[test]
fn a_requeued_result_whose_trial_waits_in_the_log_is_parked_again() {
    let (dir, mut store) = fresh();
    let mut old = result("r", 1);
    old.measurement.wall_us = 11;
    store.save(&result("r", 1)).expect("save");
    drop(store);
    // Placed in unacked/ behind the log's back (a requeue racing the agent).
    let inbox = dir.path().join(INBOX);
    fs::create_dir_all(&inbox).expect("mkdir");
    fs::write(inbox.join(file_name(&old.trial)), encode(&old).expect("encode")).expect("write");
    let store = reopen(dir.path());
    assert_eq!(store.load(), vec![result("r", 1)], "the log's result is not written over");
    let parked = SpoolView::open(dir.path()).parked();
    assert_eq!(parked.len(), 1);
    assert!(parked[0].reason.contains("already waiting"), "{parked:?}");
}

#[test]
fn replay_stops_at_what_it_cannot_read() {
    let mut log = MAGIC.to_vec();
    log::push_result(&mut log, "k1", b"abc").expect("frame");
    let whole = log.len();
    // A record of a kind this version does not know.
    log.extend_from_slice(&[1, 0, 0, 0]);
    log.extend_from_slice(&crc32fast::hash(&[9]).to_le_bytes());
    log.push(9);
    let r = replay(&log);
    assert_eq!(r.live.get("k1").map(Vec::as_slice), Some(b"abc".as_slice()));
    assert_eq!(r.valid_len, whole);
    assert_eq!(r.dropped.map(|d| (d.at, d.why)), Some((whole, "a record this agent cannot read")));
    assert_eq!(replay(b"").valid_len, 0);
    // Zeros after the records are the clean end, even fewer than a header.
    for zeros in [1usize, 7, 8, 4096] {
        let mut padded = log[..whole].to_vec();
        padded.resize(whole + zeros, 0);
        let r = replay(&padded);
        assert_eq!((r.valid_len, r.dropped), (whole, None), "{zeros} zeros");
    }
    assert_eq!(replay(b"TFSPOOL9").dropped.map(|d| d.at), Some(0));
}

/// State files were world-readable under umask 022.
#[test]
fn regression_the_state_directory_is_its_owners_alone() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tmp");
    let state = dir.path().join("agent-state");
    fs::create_dir_all(&state).expect("dir");
    fs::set_permissions(&state, fs::Permissions::from_mode(0o755)).expect("chmod");
    let _store = PendingResults::open(&state).expect("open");
    let mode = fs::metadata(&state).expect("meta").permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "{mode:o}");
}
