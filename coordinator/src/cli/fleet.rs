//! Commands about the fleet's membership: `token` (join tokens), `agents`
//! (who the store has seen, whose keys it trusts) and `key` (the
//! coordinator's own public key).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use super::args::{AgentsAction, KeyArg, TokenAction};
use super::error::{CliError, Result};
use super::output::{emit, emit_json, open_existing, unix_now_ms, watch_text};
use crate::store::{Grant, Store};

/// A new join token for the coordinator holding `identity`, kept (its
/// public half) in `store`; returns the token's text.
pub fn new_token(
    store: &mut Store,
    identity: &tunefleet_common::auth::Identity,
    ttl_ms: Option<u64>,
    uses: Option<u64>,
    tags: &BTreeMap<String, String>,
    grant: Grant,
) -> Result<String> {
    let token = tunefleet_common::auth::JoinToken::generate(&identity.public())?;
    let now = unix_now_ms();
    store.create_token(&token.public()?, ttl_ms.map(|t| now.saturating_add(t)), uses, tags, grant, now)?;
    Ok(token.to_string())
}

/// `tunefleet key`: the coordinator's public key, the key created when missing.
pub fn key(key: &KeyArg) -> Result<()> {
    let identity = key.load(Path::new("tunefleet.db"))?;
    println!("{}", tunefleet_common::auth::hex(&identity.public()));
    Ok(())
}

/// `tunefleet token create|list|revoke`.
pub fn token(action: TokenAction, store_path: &Path) -> Result<()> {
    let mut store = Store::open(store_path).map_err(CliError::open_store(store_path))?;
    match action {
        TokenAction::Create { ttl, uses, tags, slots, lookahead, gpus, total_slots, total_store_mib, out, key } => {
            if slots == Some(0) {
                return Err(CliError::refused("--slots 0 would let its agents run nothing"));
            }
            let ttl_ms = match ttl.trim() {
                "0" => None,
                t => Some(
                    crate::runtime::launch::parse_duration(t)
                        .map_err(|e| CliError::refused(format!("--ttl: {e}, or 0 for no expiry")))?
                        .as_millis() as u64,
                ),
            };
            if uses == 0 {
                return Err(CliError::refused("--uses 0 would admit no agent"));
            }
            let mut granted = BTreeMap::new();
            for t in &tags {
                let Some((k, v)) = t.split_once('=') else {
                    return Err(CliError::refused(format!("--tag {t:?}: expected key=value")));
                };
                granted.insert(k.to_string(), v.to_string());
            }
            let identity = key.load(store_path)?;
            let grant = Grant { slots, lookahead, gpus, total_slots, total_store_mib };
            let text = new_token(&mut store, &identity, ttl_ms, Some(uses), &granted, grant)?;
            let until = if ttl_ms.is_some() { format!("for {}", ttl.trim()) } else { "never expires".to_string() };
            eprintln!(
                "join token: admits {uses} new agent name(s) ({}), {until}; --uses and --ttl set them",
                describe_grant(&grant)
            );
            match out {
                Some(path) => {
                    tunefleet_common::auth::write_secret(&path, &text)?;
                    eprintln!("join token written to {} (give it to agents as --join-file)", path.display());
                }
                None => println!("{text}"),
            }
            Ok(())
        }
        TokenAction::List { json } => {
            let rows = store.tokens()?;
            if json {
                return emit_json(&rows);
            }
            let now = unix_now_ms();
            let mut out = String::new();
            for t in rows {
                let state = if t.revoked {
                    "revoked".to_string()
                } else if t.expires_ms.is_some_and(|e| now >= e) {
                    "expired".to_string()
                } else if t.uses_left == Some(0) {
                    "used up".to_string()
                } else {
                    match t.expires_ms {
                        Some(e) => format!("valid for {} more minutes", (e - now).div_ceil(60_000)),
                        None => "valid, no expiry".to_string(),
                    }
                };
                let uses = t.uses_left.map_or("any number".to_string(), |u| u.to_string());
                let tags: Vec<String> = t.tags.iter().map(|(k, v)| format!("{k}={v}")).collect();
                let grant = describe_grant(&t.grant);
                writeln!(out, "{}  {state}, {} used, {uses} left  {grant}  {}", t.id, t.used, tags.join(","))?;
            }
            emit(&out)
        }
        TokenAction::Revoke { id } => {
            let n = store.revoke_token(&id)?;
            if n == 0 {
                return Err(CliError::refused(format!(
                    "no join token with an id starting {id:?} (at least 4 hex digits; see tunefleet token list)"
                )));
            }
            println!("revoked {n} join token(s); agents they admitted stay pinned (tunefleet agents forget NAME)");
            Ok(())
        }
    }
}

/// `tunefleet agents trust|forget`: change whose key the store pins.
pub fn change(action: AgentsAction, store_path: &Path) -> Result<()> {
    let mut store = Store::open(store_path).map_err(CliError::open_store(store_path))?;
    let now = unix_now_ms();
    match action {
        AgentsAction::Trust { name, key, slots, lookahead, gpus } => {
            tunefleet_common::topic::validate_agent_id(&name)?;
            if slots == Some(0) {
                return Err(CliError::refused("--slots 0 would let the agent run nothing"));
            }
            let Some(key) = tunefleet_common::auth::parse_public_key(&key) else {
                return Err(CliError::refused(
                    "not a public key: give the 64 hex digits that `tunefleet-agent key` prints",
                ));
            };
            match store.trust_agent(&name, &key, now)? {
                Some(old) if old != key => println!(
                    "{name}: key {} pinned, replacing {}",
                    tunefleet_common::auth::hex(&key),
                    tunefleet_common::auth::hex(&old)
                ),
                _ => println!("{name}: key {} pinned", tunefleet_common::auth::hex(&key)),
            }
            if slots.is_some() || lookahead.is_some() || gpus.is_some() {
                let grant = Grant { slots, lookahead, gpus, total_slots: None, total_store_mib: None };
                store.grant_capacity(&name, grant)?;
                println!("{name}: {}", describe_grant(&grant));
            }
        }
        AgentsAction::Forget { name } => {
            if store.forget_agent_key(&name)? {
                println!("{name}: key forgotten; its next Hello pins a new one");
            } else {
                println!("{name}: no key was pinned");
            }
        }
    }
    Ok(())
}

/// `tunefleet agents [--json] [--watch]`: the agents the store has seen.
pub async fn list(path: &Path, json: bool, watch: bool, shutdown: impl std::future::Future<Output = ()>) -> Result<()> {
    let path = path.to_path_buf();
    let look = move || -> Result<String> {
        let store = open_existing(&path)?;
        if json {
            return Ok(format!("{}\n", serde_json::to_string(&store.agents()?)?));
        }
        agents_text(&store)
    };
    if watch {
        watch_text(look, json, shutdown).await
    } else {
        emit(&look()?)
    }
}

/// `tunefleet agents` as text: each agent's class, load, conditions and trials.
fn agents_text(store: &Store) -> Result<String> {
    let mut out = String::new();
    writeln!(
        out,
        "{:<24} {:<8} {:>5} {:>9} {:>5} {:>5} {:<10} {:<20} {:>8} {:<22} {:<28} tags",
        "agent",
        "arch",
        "cores",
        "mem GiB",
        "slots",
        "lost",
        "energy",
        "last status",
        "outside",
        "conditions",
        "running"
    )?;
    let now = unix_now_ms();
    for a in store.agents()? {
        let ago = now.saturating_sub(a.last_seen_ms) / 1000;
        let status = format!("{} {ago} s ago", if a.online { "online" } else { "offline" });
        let tags: Vec<String> = a.info.tags.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let energy = a.info.energy.iter().find(|e| e.readable).map_or("none", |e| e.kind.as_str());
        let outside = a
            .telemetry
            .as_ref()
            .and_then(|t| t.foreign_cpu)
            .map_or_else(|| "-".to_string(), |f| format!("{:.0} %", f * 100.0));
        let conditions = a.telemetry.as_ref().map_or_else(|| "-".to_string(), |t| describe_conditions(&t.conditions));
        let mut running = if a.running.is_empty() { "-".to_string() } else { a.running.join(" ") };
        if !a.held.is_empty() {
            running.push_str(&format!(" (held ahead: {})", a.held.join(" ")));
        }
        writeln!(
            out,
            "{:<24} {:<8} {:>5} {:>9.1} {:>5} {:>5} {:<10} {:<20} {:>8} {:<22} {:<28} {}",
            a.info.agent,
            a.info.arch,
            a.info.cores,
            a.info.memory_bytes as f64 / (1u64 << 30) as f64,
            a.info.slots,
            a.lost_held,
            energy,
            status,
            outside,
            conditions,
            running,
            tags.join(",")
        )?;
    }
    Ok(out)
}

/// A grant in words: `slots ≤ 4, lookahead ≤ 8` (`fleet caps` for none).
fn describe_grant(g: &Grant) -> String {
    let part = |what: &str, v: Option<u32>| v.map(|v| format!("{what} <= {v}"));
    let parts: Vec<String> = [
        part("slots", g.slots),
        part("lookahead", g.lookahead),
        part("gpus", g.gpus),
        part("slots in all", g.total_slots),
        g.total_store_mib.map(|m| format!("{m} MiB of each study's store in all")),
    ]
    .into_iter()
    .flatten()
    .collect();
    if parts.is_empty() {
        "fleet caps".to_string()
    } else {
        parts.join(", ")
    }
}

/// A device's conditions in a few words (`-` when it reports none).
fn describe_conditions(c: &tunefleet_common::measurement::Conditions) -> String {
    let mut words = Vec::new();
    match c.charging {
        Some(true) => words.push("charging".to_string()),
        Some(false) => words.push("on battery".to_string()),
        None => {}
    }
    if let Some(p) = c.battery_percent {
        words.push(format!("{p:.0} %"));
    }
    if c.throttled == Some(true) {
        words.push("throttled".to_string());
    }
    if let Some(t) = c.temperature_c {
        words.push(format!("{t:.0} C"));
    }
    if words.is_empty() {
        "-".to_string()
    } else {
        words.join(", ")
    }
}
