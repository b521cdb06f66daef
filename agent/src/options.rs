//! Command-line options and their validation into a [`Mode`]: the agent
//! (`--broker ...`, the default), `probe` or `measure`. Every refusal names
//! the flag and the problem; `main.rs` exits with 2. The clap definition
//! itself is [`tunefleet_common::agent_cli`], where the coordinator reads it
//! to generate the agent's man pages and shell completions.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

pub use tunefleet_common::agent_cli::{Cli, Command, EnergyArgs, SpoolAction, StateArgs};
use tunefleet_common::message::MAX_LOOKAHEAD_PER_SLOT;
use tunefleet_common::topic::{validate_agent_id, TopicError, Topics, MAX_AGENT_ID};
use tunefleet_common::BrokerUrl;

use crate::auth::NAME_FILE;
use crate::config::AgentConfig;
use crate::energy::external::{ExternalConfig, Target};
use crate::energy::{EnergyRoots, EstimateModel};

/// The state directory the flags of a subcommand name.
pub fn state_dir(args: &StateArgs) -> Result<PathBuf, ConfigError> {
    if let Some(d) = &args.state_dir {
        return Ok(d.clone());
    }
    let name = match &args.name {
        Some(n) => n.clone(),
        None => default_name(fixed_state_dir(None).as_deref()).ok_or(ConfigError::NoHostname)?,
    };
    validate_agent_id(&name).map_err(ConfigError::Name)?;
    let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    default_state_dir(&name, env("STATE_DIRECTORY"), env("XDG_STATE_HOME"), env("HOME")).ok_or(ConfigError::NoState)
}

/// What the command line asks for.
#[derive(Debug, Clone)]
pub enum Mode {
    Agent(Box<AgentConfig>),
    Probe {
        json: bool,
        roots: EnergyRoots,
        model: EstimateModel,
    },
    Measure {
        argv: Vec<String>,
        interval: Duration,
        json: bool,
        /// Where to write the JSON report too (`-o FILE`).
        output: Option<PathBuf>,
        roots: EnergyRoots,
        model: EstimateModel,
    },
    Key {
        state_dir: PathBuf,
    },
    Spool {
        state_dir: PathBuf,
        action: SpoolAction,
    },
}

/// The estimate model and the energy roots of these flags, validated.
pub fn energy(args: &EnergyArgs) -> Result<(EstimateModel, EnergyRoots), ConfigError> {
    for (flag, value) in
        [("idle-watts-per-core", args.idle_watts_per_core), ("busy-watts-per-core", args.busy_watts_per_core)]
    {
        if !value.is_finite() || value < 0.0 {
            return Err(ConfigError::Watts { flag, value });
        }
    }
    let model =
        EstimateModel { idle_watts_per_core: args.idle_watts_per_core, busy_watts_per_core: args.busy_watts_per_core };
    let roots = EnergyRoots {
        powercap: args.powercap_root.clone(),
        hwmon: args.hwmon_root.clone(),
        power_supply: args.power_supply_root.clone(),
        external: external(args)?,
        nvml_lib: args.nvml_lib.clone(),
        ..EnergyRoots::default()
    };
    Ok((model, roots))
}

/// The external meter, when `--energy-command` or `--energy-url` is given.
fn external(args: &EnergyArgs) -> Result<Option<ExternalConfig>, ConfigError> {
    let target = match (&args.energy_command, &args.energy_url) {
        (Some(c), _) if c.trim().is_empty() => return Err(ConfigError::EnergyCommand),
        (Some(c), _) => Target::Command(c.clone()),
        (None, Some(u)) => Target::Url(u.parse().map_err(ConfigError::EnergyUrl)?),
        (None, None) => return Ok(None),
    };
    let unit = args.energy_unit.parse().map_err(ConfigError::EnergyUnit)?;
    let timeout = positive_duration("energy-timeout", &args.energy_timeout)?;
    Ok(Some(ExternalConfig { target, unit, timeout }))
}

/// Where unacknowledged results are kept when `--state-dir` is not given:
/// systemd's `StateDirectory=`, else the XDG state home, per agent name.
pub fn default_state_dir(
    name: &str,
    systemd: Option<PathBuf>,
    xdg_state: Option<PathBuf>,
    home: Option<PathBuf>,
) -> Option<PathBuf> {
    systemd.or_else(|| {
        xdg_state.or_else(|| home.map(|h| h.join(".local/state"))).map(|d| d.join("tunefleet-agent").join(name))
    })
}

fn positive_duration(flag: &'static str, value: &str) -> Result<Duration, ConfigError> {
    parse_duration(value)
        .filter(|d| !d.is_zero())
        .ok_or_else(|| ConfigError::Duration { flag, value: value.to_string() })
}

/// Why the options were refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("--broker: {0}")]
    Broker(#[from] tunefleet_common::broker_url::BrokerUrlError),
    #[error(transparent)]
    Security(#[from] tunefleet_common::security::SecurityError),
    #[error("--tag {0:?}: expected KEY=VALUE with a non-empty KEY")]
    Tag(String),
    #[error("--slots must be at least 1")]
    Slots,
    #[error("--broker: a list of brokers is all mqtt:// or all mqtts://, one set of TLS files for all")]
    MixedBrokers,
    #[error("--lookahead {lookahead}: at most {most} trials are held ahead ({per} per slot, --slots {slots})")]
    Lookahead { lookahead: u32, slots: u32, per: u32, most: u32 },
    #[error("--name: {0}")]
    Name(TopicError),
    #[error("cannot find a host name for the default --name; pass --name")]
    NoHostname,
    #[error("--root: {0}")]
    Root(TopicError),
    #[error("--{flag} {value:?}: expected a duration such as 500ms, 30s, 5m or 1h")]
    Duration { flag: &'static str, value: String },
    #[error("--{flag} {value}: expected a finite number of watts, 0 or more")]
    Watts { flag: &'static str, value: f64 },
    #[error("--max-trials must be at least 1")]
    MaxTrials,
    #[error("--broker (or TUNEFLEET_BROKER) is required to run as an agent; or use a subcommand: probe, measure, key, spool")]
    NoBroker,
    #[error("--coordinator-key {0:?}: expected the 64 hex digits that `tunefleet key` prints")]
    CoordinatorKey(String),
    #[error("--join: {0}")]
    Join(tunefleet_common::auth::BadJoinToken),
    #[error("--join-file {path}: {source}")]
    JoinFile { path: PathBuf, source: std::io::Error },
    #[error(
        "--join-file {path}: every user can read it (mode {mode:o}), and a join token admits agents: chmod 600 {path}"
    )]
    JoinFileMode { path: PathBuf, mode: u32 },
    #[error("{0}")]
    AllowCommand(String),
    #[error("no state directory: give --state-dir (or set HOME, XDG_STATE_HOME or STATE_DIRECTORY)")]
    NoState,
    #[error("--energy-command: empty command")]
    EnergyCommand,
    #[error("--energy-url {0}")]
    EnergyUrl(String),
    #[error("--energy-unit {0}")]
    EnergyUnit(String),
    #[error("--min-battery {0}: expected a percentage from 0 to 100")]
    MinBattery(f64),
    #[error("--cpus {0:?}: expected a non-empty CPU list such as 0, 0-3 or 2,5-7")]
    CpuList(String),
    #[error("--cpus {value}: {source}")]
    Cpus {
        value: String,
        #[source]
        source: crate::cpus::OutsideCpus,
    },
    #[error("--interference-threshold {0}: expected a fraction of the agent's CPUs, from 0 to 1")]
    InterferenceThreshold(f64),
}

/// Parses `500ms`, `30s`, `5m`, `1h` or a bare number of seconds.
pub fn parse_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(text.len());
    let (num, unit) = text.split_at(split);
    let value: f64 = num.parse().ok()?;
    let secs = match unit {
        "" | "s" => value,
        "ms" => value / 1000.0,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        _ => return None,
    };
    Duration::try_from_secs_f64(secs).ok()
}

/// Turns a host name into a valid agent id: characters outside
/// `[A-Za-z0-9._-]` become `-`, at most 64 characters.
pub fn sanitize_name(raw: &str) -> String {
    raw.chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '-' })
        .take(MAX_AGENT_ID)
        .collect()
}

/// The `--cpus` set: a CPU list, every CPU of it among `allowed`.
pub fn parse_cpus(text: &str, allowed: &[u32]) -> Result<Vec<u32>, ConfigError> {
    let cpus = crate::live::parse_cpu_list(text)
        .filter(|c| !c.is_empty())
        .ok_or_else(|| ConfigError::CpuList(text.to_string()))?;
    crate::cpus::confine(&cpus, allowed).map_err(|source| ConfigError::Cpus { value: text.to_string(), source })
}

/// Parses `KEY=VALUE`.
pub fn parse_tag(text: &str) -> Result<(String, String), ConfigError> {
    match text.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.to_string())),
        _ => Err(ConfigError::Tag(text.to_string())),
    }
}

fn hostname() -> Option<String> {
    let name = rustix::system::uname().nodename().to_string_lossy().into_owned();
    let name = sanitize_name(&name);
    (!name.is_empty()).then_some(name)
}

/// The agent's default name: the host name and 6 hex digits of a hash of
/// this machine's id (`/etc/machine-id`), so boards imaged alike (twenty
/// called `raspberrypi`) get names of their own; the bare host name where
/// an agent of that name already keeps its state here (an agent installed
/// before names had the id), or where the machine has no id.
///
/// A state directory that does not depend on the name (`--state-dir`,
/// systemd's `$STATE_DIRECTORY`) keeps the name its key was made under
/// ([`NAME_FILE`], written by the agent): that one is used.
fn default_name(fixed_state: Option<&std::path::Path>) -> Option<String> {
    let host = hostname()?;
    let id = std::fs::read_to_string("/etc/machine-id").ok();
    let legacy = match fixed_state {
        Some(dir) => {
            let kept = std::fs::read_to_string(dir.join(NAME_FILE)).ok();
            if let Some(name) = kept.as_deref().map(str::trim).filter(|n| validate_agent_id(n).is_ok()) {
                return Some(name.to_string());
            }
            dir.join("agent.key").exists()
        }
        None => {
            let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
            default_state_dir(&host, None, env("XDG_STATE_HOME"), env("HOME"))
                .is_some_and(|d| d.join("agent.key").exists())
        }
    };
    Some(name_for(&host, id.as_deref(), legacy))
}

/// The state directory named by flags or systemd, whatever the agent's name.
fn fixed_state_dir(flag: Option<&PathBuf>) -> Option<PathBuf> {
    flag.cloned().or_else(|| std::env::var_os("STATE_DIRECTORY").filter(|v| !v.is_empty()).map(PathBuf::from))
}

/// [`default_name`] from its parts.
fn name_for(host: &str, machine_id: Option<&str>, legacy: bool) -> String {
    match machine_id.map(str::trim).filter(|id| !id.is_empty() && !legacy) {
        Some(id) => {
            let digest = tunefleet_common::auth::sha256(&[b"tunefleet agent name\0", id.as_bytes()]);
            format!("{host}-{}", tunefleet_common::auth::hex(&digest[..3]))
        }
        None => host.to_string(),
    }
}

/// Validates the options into what to do.
pub fn into_mode(cli: Cli) -> Result<Mode, ConfigError> {
    match cli.command.clone() {
        None => Ok(Mode::Agent(Box::new(into_config(cli)?))),
        Some(Command::Probe { json, energy: flags }) => {
            let (model, roots) = energy(&flags)?;
            Ok(Mode::Probe { json, roots, model })
        }
        Some(Command::Measure { interval, json, output, energy: flags, command }) => {
            let (model, roots) = energy(&flags)?;
            let interval = positive_duration("interval", &interval)?;
            Ok(Mode::Measure { argv: command, interval, json, output, roots, model })
        }
        Some(Command::Key { state }) => Ok(Mode::Key { state_dir: state_dir(&state)? }),
        Some(Command::Spool { action, state }) => {
            Ok(Mode::Spool { state_dir: state_dir(&state)?, action: action.unwrap_or(SpoolAction::List) })
        }
    }
}

/// Validates the options of the agent mode.
pub fn into_config(cli: Cli) -> Result<AgentConfig, ConfigError> {
    let broker_text = cli.broker.ok_or(ConfigError::NoBroker)?;
    let mut brokers = broker_text.split(',').map(|b| b.trim().parse::<BrokerUrl>());
    let broker: BrokerUrl = brokers.next().ok_or(ConfigError::NoBroker)??;
    let more_brokers: Vec<BrokerUrl> = brokers.collect::<Result<_, _>>()?;
    if more_brokers.iter().any(|b| b.tls != broker.tls) {
        return Err(ConfigError::MixedBrokers);
    }
    let password = std::env::var(tunefleet_common::security::PASSWORD_ENV).ok();
    let security = cli.security.resolve(&broker, password)?;
    let name = match cli.name {
        Some(n) => n,
        None => default_name(fixed_state_dir(cli.state_dir.as_ref()).as_deref()).ok_or(ConfigError::NoHostname)?,
    };
    validate_agent_id(&name).map_err(ConfigError::Name)?;
    if cli.slots == 0 {
        return Err(ConfigError::Slots);
    }
    if cli.max_trials == Some(0) {
        return Err(ConfigError::MaxTrials);
    }
    let topics = Topics::new(&cli.root).map_err(ConfigError::Root)?;
    let tags = cli.tags.iter().map(|t| parse_tag(t)).collect::<Result<BTreeMap<_, _>, _>>()?;
    let duration = |flag: &'static str, value: &str| {
        parse_duration(value).ok_or_else(|| ConfigError::Duration { flag, value: value.to_string() })
    };
    let exit_when_idle = cli.exit_when_idle.as_deref().map(|v| duration("exit-when-idle", v)).transpose()?;
    let grace = duration("grace", &cli.grace)?;
    let (energy_model, energy_roots) = energy(&cli.energy)?;
    if !(0.0..=100.0).contains(&cli.min_battery) {
        return Err(ConfigError::MinBattery(cli.min_battery));
    }
    let sample_interval = positive_duration("sample-interval", &cli.sample_interval)?;
    let telemetry_interval = positive_duration("telemetry-interval", &cli.telemetry_interval)?;
    let cpus = cli.cpus.map(|text| parse_cpus(&text, &crate::cpus::allowed_cpus())).transpose()?;
    if !(0.0..=1.0).contains(&cli.interference_threshold) {
        return Err(ConfigError::InterferenceThreshold(cli.interference_threshold));
    }
    let name_for_state = name.clone();
    let mut config = AgentConfig::new(broker, name, topics);
    config.more_brokers = more_brokers;
    config.tags = tags;
    config.slots = cli.slots;
    config.lookahead = match cli.lookahead {
        Some(n) if n > cli.slots.saturating_mul(MAX_LOOKAHEAD_PER_SLOT) => {
            let (per, most) = (MAX_LOOKAHEAD_PER_SLOT, cli.slots.saturating_mul(MAX_LOOKAHEAD_PER_SLOT));
            return Err(ConfigError::Lookahead { lookahead: n, slots: cli.slots, per, most });
        }
        other => other,
    };
    config.keepalive = Duration::from_secs(cli.keepalive);
    config.state_dir = cli.state_dir.or_else(|| {
        let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
        default_state_dir(&name_for_state, env("STATE_DIRECTORY"), env("XDG_STATE_HOME"), env("HOME"))
    });
    config.max_trials = cli.max_trials;
    config.exit_when_idle = exit_when_idle;
    config.grace = grace;
    config.cgroup_root = cli.cgroup_root;
    config.conditions = crate::conditions::ConditionsConfig {
        power_supply: energy_roots.power_supply.clone(),
        thermal: cli.thermal_root,
        cpu: cli.cpu_sysfs_root,
        min_battery: cli.min_battery,
        ..Default::default()
    };
    config.energy_model = energy_model;
    config.energy_roots = energy_roots;
    config.sample_interval = sample_interval;
    config.telemetry_interval = telemetry_interval;
    config.cpus = cpus;
    config.interference_threshold = cli.interference_threshold;
    config.security = security;
    config.coordinator_key = cli
        .coordinator_key
        .map(|k| tunefleet_common::auth::parse_public_key(&k).ok_or(ConfigError::CoordinatorKey(k)))
        .transpose()?;
    let join = match (cli.join, cli.join_file) {
        (Some(text), _) => Some(text),
        (None, Some(path)) => {
            // A token admits agents: one every user can read is refused, as ssh refuses such a key.
            use std::os::unix::fs::PermissionsExt;
            let meta =
                std::fs::metadata(&path).map_err(|source| ConfigError::JoinFile { path: path.clone(), source })?;
            let mode = meta.permissions().mode() & 0o777;
            if mode & 0o004 != 0 {
                return Err(ConfigError::JoinFileMode { path, mode });
            }
            Some(std::fs::read_to_string(&path).map_err(|source| ConfigError::JoinFile { path, source })?)
        }
        (None, None) => None,
    };
    config.join = join.map(|t| t.parse().map_err(ConfigError::Join)).transpose()?;
    config.trust_first_coordinator = cli.trust_first_coordinator;
    config.allow.commands = crate::allow::parse(&cli.allow_commands).map_err(ConfigError::AllowCommand)?;
    config.allow.env.clone_from(&cli.allow_env);
    Ok(config)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[test]
    fn the_command_line_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    fn cli(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("tunefleet-agent").chain(args.iter().copied()))
    }

    fn config(args: &[&str]) -> Result<AgentConfig, ConfigError> {
        into_config(cli(args).expect("clap accepts"))
    }

    #[test]
    fn full_command_line() {
        let c = config(&[
            "--broker=mqtt://127.0.0.1:1884",
            "--name",
            "n-1",
            "--tag",
            "rack=a",
            "--tag",
            "gpu=",
            "--slots",
            "3",
            "--root",
            "t/x",
            "--keepalive",
            "9",
            "--exit-when-idle",
            "--max-trials",
            "4",
        ])
        .expect("valid");
        assert_eq!((c.broker.port, c.name.as_str(), c.slots), (1884, "n-1", 3));
        assert_eq!(c.tags.get("rack").map(String::as_str), Some("a"));
        assert_eq!(c.tags.get("gpu").map(String::as_str), Some(""));
        assert_eq!(c.topics.root(), "t/x");
        assert_eq!(c.keepalive, Duration::from_secs(9));
        assert_eq!(c.exit_when_idle, Some(Duration::from_secs(30)));
        assert_eq!(c.max_trials, Some(4));
        let c = config(&["--broker", "mqtt://h", "--name", "x", "--exit-when-idle=250ms"]).expect("valid");
        assert_eq!(c.exit_when_idle, Some(Duration::from_millis(250)));
        assert_eq!(c.slots, 1);
        assert_eq!(c.grace, Duration::from_secs(10));
    }

    #[test]
    fn refusals_name_the_problem() {
        let err = |args: &[&str]| config(args).expect_err("refused").to_string();
        assert!(err(&["--broker", "http://x:1", "--name", "a"]).contains("--broker"));
        assert!(err(&["--broker", "mqtts://x:1", "--name", "a"]).contains("--ca"), "mqtts needs the CA");
        assert!(err(&["--broker", "mqtt://x", "--name", "a", "--tag", "novalue"]).contains("--tag"));
        assert!(err(&["--broker", "mqtt://x", "--name", "a", "--tag", "=v"]).contains("--tag"));
        assert!(err(&["--broker", "mqtt://x", "--name", "a", "--slots", "0"]).contains("--slots"));
        assert!(err(&["--broker", "mqtt://x", "--name", "a/b"]).contains("--name"));
        assert!(err(&["--broker", "mqtt://x", "--name", "a", "--root", "a/+"]).contains("--root"));
        assert!(err(&["--broker", "mqtt://x", "--name", "a", "--grace", "soon"]).contains("--grace"));
        assert!(cli(&["--name", "a", "--slots", "x", "--broker", "mqtt://x"]).is_err());
        assert!(err(&["--broker", "mqtt://x", "--name", "a", "--telemetry-interval", "0s"])
            .contains("--telemetry-interval"));
        assert!(err(&["--broker", "mqtt://x", "--name", "a", "--busy-watts-per-core=-1"]).contains("--busy-watts"));
        assert!(err(&["--broker", "mqtt://x", "--name", "a", "--interference-threshold", "1.5"])
            .contains("--interference-threshold"));
        assert!(
            err(&["--broker", "mqtt://x", "--name", "a", "--cpus", "4096"]).contains("--cpus 4096: CPU 4096 is not")
        );
    }

    #[test]
    fn several_brokers_are_tried_in_turn_all_of_one_kind() {
        let c = config(&["--broker", "mqtt://a:1, mqtt://b:2", "--name", "n"]).expect("valid");
        assert_eq!((c.broker.host.as_str(), c.broker.port), ("a", 1));
        let more: Vec<(String, u16)> = c.more_brokers.iter().map(|b| (b.host.clone(), b.port)).collect();
        assert_eq!(more, [("b".to_string(), 2)]);
        let err = config(&["--broker", "mqtt://a:1,mqtts://b:2", "--name", "n"]).expect_err("mixed");
        assert!(err.to_string().contains("all mqtt:// or all mqtts://"), "{err}");
        assert!(config(&["--broker", "mqtt://a:1,", "--name", "n"]).is_err(), "an empty one");
    }

    #[test]
    fn cpus_and_interference_threshold() {
        let allowed = crate::cpus::allowed_cpus();
        let c = config(&["--broker", "mqtt://x", "--name", "a"]).expect("valid");
        assert_eq!((c.cpus, c.interference_threshold), (None, 0.25));
        let first = allowed[0].to_string();
        let c = config(&["--broker", "mqtt://x", "--name", "a", "--cpus", &first, "--interference-threshold", "0.5"])
            .expect("valid");
        assert_eq!((c.cpus, c.interference_threshold), (Some(vec![allowed[0]]), 0.5));
        let machine = [0, 1, 2, 3, 5];
        assert_eq!(parse_cpus("3,0-1,1", &machine).expect("valid"), [0, 1, 3]);
        for bad in ["", "x", "3-1", "1,,a"] {
            assert!(matches!(parse_cpus(bad, &machine), Err(ConfigError::CpuList(_))), "{bad:?}");
        }
        let outside = parse_cpus("2-5", &machine).expect_err("4 is not allowed").to_string();
        assert_eq!(outside, "--cpus 2-5: CPU 4 is not among those this process may use (0-3,5)");
    }

    #[test]
    fn external_meter_and_conditions() {
        let base = ["--broker", "mqtt://x", "--name", "a"];
        let with = |extra: &[&str]| config(&[&base[..], extra].concat());
        let c = with(&[]).expect("valid");
        assert!(c.energy_roots.external.is_none());
        assert_eq!(c.conditions.min_battery, crate::conditions::DEFAULT_MIN_BATTERY);
        assert_eq!(c.conditions.thermal, PathBuf::from(crate::conditions::THERMAL_ROOT));
        let c =
            with(&["--energy-command", "pdu-read 7", "--energy-unit", "joules", "--min-battery", "35"]).expect("valid");
        let ext = c.energy_roots.external.expect("external meter");
        assert_eq!(ext.target, Target::Command("pdu-read 7".into()));
        assert_eq!((ext.unit, ext.timeout), (crate::energy::external::Unit::Joules, Duration::from_secs(2)));
        assert_eq!(c.conditions.min_battery, 35.0);
        let c = with(&["--energy-url", "http://plug.lab/power", "--energy-timeout", "500ms"]).expect("valid");
        let ext = c.energy_roots.external.expect("external meter");
        assert_eq!(ext.target.to_string(), "GET http://plug.lab:80/power");
        assert_eq!((ext.unit, ext.timeout), (crate::energy::external::Unit::Watts, Duration::from_millis(500)));
        let c = with(&["--power-supply-root", "/x/ps", "--thermal-root", "/x/th"]).expect("valid");
        assert_eq!((c.conditions.power_supply, c.conditions.thermal), ("/x/ps".into(), "/x/th".into()));
        let err = |extra: &[&str]| with(extra).expect_err("refused").to_string();
        assert!(err(&["--energy-url", "https://plug/"]).starts_with("--energy-url"));
        assert!(err(&["--energy-command", " "]).starts_with("--energy-command"));
        assert!(err(&["--energy-command", "x", "--energy-timeout", "0s"]).contains("--energy-timeout"));
        assert!(err(&["--min-battery", "120"]).starts_with("--min-battery"));
        assert!(cli(&[&base[..], &["--energy-command", "x", "--energy-url", "http://h/"]].concat()).is_err());
        assert!(cli(&[&base[..], &["--energy-unit", "kwh"]].concat()).is_err());
        match mode(&["measure", "--energy-command", "echo 3 W", "--", "true"]).expect("measure") {
            Mode::Measure { roots, .. } => assert!(roots.external.is_some()),
            other => panic!("not measure: {other:?}"),
        }
    }

    fn mode(args: &[&str]) -> Result<Mode, ConfigError> {
        into_mode(cli(args).expect("clap accepts"))
    }

    #[test]
    fn subcommands() {
        match mode(&["probe", "--json", "--powercap-root", "/x/powercap"]).expect("probe") {
            Mode::Probe { json, roots, .. } => {
                assert!(json);
                assert_eq!(roots.powercap, PathBuf::from("/x/powercap"));
                assert_eq!(roots.hwmon, PathBuf::from(crate::energy::HWMON_ROOT));
            }
            other => panic!("not probe: {other:?}"),
        }
        match mode(&["measure", "--interval", "100ms", "--", "ls", "-l", "--all"]).expect("measure") {
            Mode::Measure { argv, interval, json, .. } => {
                assert_eq!(argv, ["ls", "-l", "--all"]);
                assert_eq!(interval, Duration::from_millis(100));
                assert!(!json);
            }
            other => panic!("not measure: {other:?}"),
        }
        assert!(cli(&["measure"]).is_err(), "a command is required");
        assert!(cli(&["probe", "--broker", "mqtt://x"]).is_err());
        assert!(mode(&["measure", "--interval", "soon", "--", "true"])
            .expect_err("bad")
            .to_string()
            .contains("--interval"));
        let no_broker = Cli::try_parse_from(["tunefleet-agent", "--name", "a"]).expect("parses");
        if std::env::var_os("TUNEFLEET_BROKER").is_none() {
            assert!(matches!(into_mode(no_broker), Err(ConfigError::NoBroker)));
        }
    }

    #[test]
    fn durations_names_and_tags() {
        assert_eq!(parse_duration("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_duration("2"), Some(Duration::from_secs(2)));
        assert_eq!(parse_duration("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Some(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Some(Duration::from_secs(3600)));
        for bad in ["", "s", "5x", "-1s", "1e999"] {
            assert_eq!(parse_duration(bad), None, "{bad}");
        }
        assert_eq!(sanitize_name("my host.local/x"), "my-host.local-x");
        assert_eq!(sanitize_name(&"a".repeat(100)).len(), MAX_AGENT_ID);
        assert!(validate_agent_id(&sanitize_name("wéird näme")).is_ok());
        assert_eq!(parse_tag("k=v=w").expect("ok"), ("k".into(), "v=w".into()));
    }

    /// A world-readable join file was accepted silently.
    #[test]
    fn regression_a_join_file_every_user_can_read_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tmp");
        let file = dir.path().join("join.token");
        std::fs::write(&file, "not read").expect("write");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let path = file.display().to_string();
        let args = ["--broker", "mqtt://127.0.0.1:1883", "--name", "a", "--join-file", &path];
        let e = into_config(cli(&args).expect("parses")).expect_err("refused");
        assert!(matches!(e, ConfigError::JoinFileMode { mode: 0o644, .. }), "{e}");
        assert!(e.to_string().contains("chmod 600"), "{e}");
    }

    /// The unit names agents after the host, and twenty boards
    /// imaged alike were all `raspberrypi`.
    #[test]
    fn regression_default_names_differ_between_machines_of_one_host_name() {
        let a = name_for("raspberrypi", Some("4f1d0c1e9a2b4c7d8e9f0a1b2c3d4e5f\n"), false);
        let b = name_for("raspberrypi", Some("0123456789abcdef0123456789abcdef"), false);
        assert!(a.starts_with("raspberrypi-") && a.len() == "raspberrypi-".len() + 6, "{a}");
        assert_ne!(a, b);
        assert_eq!(a, name_for("raspberrypi", Some("4f1d0c1e9a2b4c7d8e9f0a1b2c3d4e5f"), false), "stable");
        assert_eq!(name_for("raspberrypi", Some("4f1d"), true), "raspberrypi", "an installed agent keeps its name");
        assert_eq!(name_for("raspberrypi", None, false), "raspberrypi");
        assert!(validate_agent_id(&a).is_ok());
    }

    #[test]
    fn default_state_dir_prefers_systemd_then_xdg_then_home() {
        let p = |s: &str| Some(PathBuf::from(s));
        assert_eq!(default_state_dir("a", p("/var/lib/x"), p("/xdg"), p("/home/u")), p("/var/lib/x"));
        assert_eq!(default_state_dir("a", None, p("/xdg"), p("/home/u")), p("/xdg/tunefleet-agent/a"));
        assert_eq!(default_state_dir("a", None, None, p("/home/u")), p("/home/u/.local/state/tunefleet-agent/a"));
        assert_eq!(default_state_dir("a", None, None, None), None);
    }
}
