//! The handshake: a signed Hello checked from cheapest to dearest (its
//! shape and names, what the store knows of the name and of its join
//! token, the budgets, the signatures), a new key pinned, the capacity and
//! tags the operator granted applied, then a session and its Welcome; a
//! refusal the agent can act on is told to it, signed. And the end of a
//! session: an agent's Last Will, taken only when it is its session's.

use tunefleet_common::auth::{self, Signed, Will};
use tunefleet_common::message::AgentStatus;

use super::ctx::Ctx;
use super::types::{loud, EngineError};
use crate::runtime::auth::{Admission, HelloRefusal, WillCheck};

/// A signed Hello: the cheap checks, then with what the store knows of the
/// name the replay check and admission (a pinned key, a join token, or open
/// enrolment) and their budgets, then the signatures; a new key is pinned,
/// then a session and its Welcome.
pub(super) fn on_hello(cx: &mut Ctx<'_, '_>, agent: String, signed: &Signed, now: u64) -> Result<(), EngineError> {
    let began = std::time::Instant::now();
    let refused = |cx: &mut Ctx<'_, '_>, e, hello: Option<&auth::Hello>| refuse(cx, &agent, signed, e, hello, now);
    let hello = match cx.sessions.peek_hello(&agent, signed) {
        Ok(h) => h,
        Err(e) => {
            refused(cx, e, None);
            return Ok(());
        }
    };
    if let Err(why) = crate::domain::bounds::agent_info(&hello.info) {
        refused(cx, HelloRefusal::Invalid(why.to_string()), Some(&hello));
        return Ok(());
    }
    let known = cx.batch.known(&agent)?;
    let token = match (&known.pin, &hello.enrol) {
        (None, Some(e)) => cx.batch.token(&e.token)?,
        // A new key under a pinned name: its token may re-key the name.
        (Some(k), Some(e)) if *k != hello.key => cx.batch.token(&e.token)?,
        _ => None,
    };
    let admitted = cx.sessions.admit(&agent, &hello, &known, token.as_ref(), cx.now.instant, now);
    // A new key spends the budget of new agents only once its signatures hold.
    let checked = admitted.and_then(|a| cx.sessions.verify(&hello, signed, &a).map(|d| (a, d))).and_then(|(a, d)| {
        if a != Admission::Known {
            cx.sessions.spend(&a, cx.now.instant)?;
        }
        Ok((a, d))
    });
    let (admission, digest) = match checked {
        Ok(c) => c,
        Err(e) => {
            refused(cx, e, Some(&hello));
            return Ok(());
        }
    };
    match &admission {
        Admission::Known => {}
        Admission::Token(public) => {
            cx.batch.enrol(&agent, &hello.key, Some(public), now)?;
            tracing::info!(agent = %agent, key = %auth::short_key(&hello.key), token = %crate::store::token_id(public), "new agent enrolled with a join token: its key is pinned from now on");
        }
        Admission::Rekey(public) => {
            let old = cx.batch.replace_agent_key(&agent, &hello.key, now)?;
            cx.sessions.end(&agent);
            tracing::warn!(
                agent = %agent,
                old_key = %old.map(|k| auth::short_key(&k)).unwrap_or_default(),
                new_key = %auth::short_key(&hello.key),
                token = %crate::store::token_id(public),
                "agent re-keyed by the launch token that enrolled it (a restarted container): the old key is revoked"
            );
        }
        Admission::Open => {
            cx.batch.enrol(&agent, &hello.key, None, now)?;
            tracing::warn!(agent = %agent, key = %auth::short_key(&hello.key), "new agent pinned by OPEN ENROLMENT (no join token): any broker user could have been it");
        }
    }
    // The store first: a store error here undoes this Hello alone (its
    // savepoint) before any session is opened.
    cx.batch.record_hello(&agent, hello.info.instance, hello.seq)?;
    cx.batch.clear_refusal(&agent)?;
    let mut info = hello.info.clone();
    // The tags a join token granted are the agent's, whatever it claims;
    // so is the capacity it was granted (at most the fleet's cap).
    let (granted_tags, granted) = cx.batch.granted(&agent)?;
    info.tags.extend(granted_tags.clone());
    let announced = (info.slots, info.lookahead);
    if crate::domain::sched::grant(&mut info, granted.slots, granted.lookahead, cx.sessions.max_slots) {
        tracing::info!(agent = %agent, announced_slots = announced.0, announced_lookahead = announced.1, slots = info.slots, lookahead = info.lookahead, "agent announced more than it was granted: given what it was granted");
    }
    let holder = token_share(cx, &agent, &mut info)?;
    let announced_gpus = info.gpus.len();
    if crate::domain::sched::grant_gpus(&mut info, granted.gpus, cx.sessions.max_gpus) {
        tracing::info!(agent = %agent, announced_gpus, gpus = info.gpus.len(), "agent announced more GPUs than it was granted: given what it was granted");
    }
    cx.batch.set_will_hash(&agent, Some(&hello.will_hash))?;
    cx.batch.upsert_agent(&info, now)?;
    // Its key pinned in the store, not only sent, before a session trusts it.
    cx.batch.settle()?;
    let (token, payload) = match cx.sessions.accept(&agent, &hello, digest) {
        Ok(w) => w,
        Err(e) => {
            tracing::error!(agent = %agent, error = %e, "cannot open a session");
            return Ok(());
        }
    };
    tracing::info!(agent = %agent, arch = %info.arch, cores = info.cores, slots = info.slots, session = %format!("{token:016x}"), "agent announced");
    cx.agents_seen.insert(agent.clone());
    cx.effects.extend(cx.sched.hello(info));
    cx.sched.set_granted(&agent, granted_tags);
    if let Some((token, bytes)) = holder {
        cx.sched.set_holder(&agent, &token, bytes);
    }
    cx.welcomes.push((agent, payload));
    // What this Hello cost paces the next ones of its kind.
    cx.sessions.measured(&admission, began.elapsed());
    Ok(())
}

/// A token's names share its `--total-slots`: `agent` is given at most
/// what its token's other names online leave. Its `--total-store-mib`: the
/// token (`token ID`) and the bytes of each study's store its names share.
fn token_share(
    cx: &mut Ctx<'_, '_>,
    agent: &str,
    info: &mut tunefleet_common::message::AgentInfo,
) -> Result<Option<(String, u64)>, EngineError> {
    let Some(share) = cx.batch.token_share(agent)? else { return Ok(None) };
    if let Some(total) = share.total_slots {
        let held: u32 = share.siblings.iter().filter_map(|n| cx.sched.live_slots(n)).fold(0, u32::saturating_add);
        let left = total.saturating_sub(held);
        if info.slots > left {
            tracing::warn!(agent = %agent, slots = left, token_slots = total, held_by_its_other_agents = held, "agent given what its join token's slots leave: its other agents hold the rest");
            info.slots = left;
        }
    }
    Ok(share.total_store_mib.map(|mib| (format!("token {}", share.id), mib.saturating_mul(1024 * 1024))))
}

/// A refused Hello: counted and logged at a bounded rate; the agent hears
/// why, signed, where it can act on it (and the refusal is kept for the
/// live page); the agent that holds the name hears when another machine
/// tried to take it.
fn refuse(cx: &mut Ctx<'_, '_>, agent: &str, signed: &Signed, e: HelloRefusal, hello: Option<&auth::Hello>, now: u64) {
    if matches!(e, HelloRefusal::RateLimited(_)) {
        cx.stats.rate_limited_hellos += 1;
        if loud(cx.stats.rate_limited_hellos) {
            tracing::warn!(agent = %agent, dropped = cx.stats.rate_limited_hellos, "{e}");
        }
        return;
    }
    cx.stats.refused_hellos += 1;
    if loud(cx.stats.refused_hellos) {
        tracing::error!(agent = %agent, refused = cx.stats.refused_hellos, "Hello refused: {e}");
    }
    // The agent hears why, signed, where it can act on it (per name and
    // key: another key's Hellos never use up the holder's notices).
    if let Some(notice) = hello.and_then(|h| cx.sessions.refusal_notice(h, signed, &e, cx.now.instant)) {
        cx.welcomes.push((agent.to_string(), notice));
        // Kept for the live page (bounded, at the notices' own rate).
        if let Err(err) = cx.batch.record_refusal(agent, &e.to_string(), now) {
            tracing::warn!(agent = %agent, error = %err, "cannot record a refused Hello");
        }
    }
    // The agent that holds the name hears that another machine tried it,
    // on a budget of its own (one a minute).
    if let HelloRefusal::NameInUse { got, .. } = &e {
        if cx.sessions.tell_holder(agent, cx.now.instant) {
            let text = format!(
                "another machine tried to join under this agent's name {agent:?} with key {got} and was refused: \
                 give each agent its own --name"
            );
            cx.out.push((agent.to_string(), tunefleet_common::message::CoordinatorMessage::Notice(text)));
        }
    }
}

/// An agent's Last Will: offline only if it is the will its session (or,
/// after a coordinator restart, its last recorded session) committed to.
pub(super) fn on_will(cx: &mut Ctx<'_, '_>, agent: String, will: &Will, now: u64) -> Result<(), EngineError> {
    let genuine = match cx.sessions.will(&agent, will) {
        WillCheck::Live => true,
        WillCheck::NoSession => cx.batch.will_hash(&agent)?.is_some_and(|h| auth::will_matches(will, &h)),
        WillCheck::Forged => {
            cx.stats.forged_wills += 1;
            tracing::warn!(agent = %agent, forged = cx.stats.forged_wills, "a Last Will that is not this session's: ignored");
            return Ok(());
        }
    };
    if !genuine {
        // The retained will of an earlier session, seen again after a restart.
        tracing::debug!(agent = %agent, "stale Last Will ignored");
        return Ok(());
    }
    cx.batch.set_will_hash(&agent, None)?;
    cx.batch.set_agent_online(&agent, false, now)?;
    tracing::info!(agent = %agent, "agent lost its connection (Last Will)");
    cx.telemetry.forget(&agent);
    cx.effects.extend(cx.sched.status(&agent, &AgentStatus { online: false, instance: will.instance }));
    Ok(())
}
