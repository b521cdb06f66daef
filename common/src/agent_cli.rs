//! The command line of `tunefleet-agent`, as clap definitions only: the
//! agent validates it (`tunefleet_agent::options`), and the coordinator
//! generates the agent's man pages and shell completions from it
//! (`tunefleet man --agent`, `tunefleet completions SHELL --agent`) so that
//! the small static agent carries no generator. The defaults of its sysfs
//! roots and thresholds are here too, and the agent's modules use them.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::topic::DEFAULT_ROOT;

/// Default root of the RAPL powercap zones.
pub const POWERCAP_ROOT: &str = "/sys/class/powercap";
/// Default root of the hwmon sensors.
pub const HWMON_ROOT: &str = "/sys/class/hwmon";
/// Default root of the batteries and power supplies.
pub const POWER_SUPPLY_ROOT: &str = "/sys/class/power_supply";
/// Default root of the thermal zones and cooling devices.
pub const THERMAL_ROOT: &str = "/sys/class/thermal";
/// Default root of the CPUs (`cpuN/thermal_throttle`).
pub const CPU_ROOT: &str = "/sys/devices/system/cpu";
/// Default mount point of the cgroup v2 hierarchy.
pub const CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// Default battery level below which a device on battery takes no trials.
pub const DEFAULT_MIN_BATTERY: f64 = 20.0;
/// The default `--interference-threshold`: a trial is flagged when more
/// than a quarter of the agent's CPUs was busy with load from outside it.
pub const DEFAULT_INTERFERENCE_THRESHOLD: f64 = 0.25;

/// `tunefleet-agent`: runs trials handed out by a Tunefleet coordinator
/// (with `--broker`), or probes and measures this machine on its own.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "tunefleet-agent",
    version = crate::version(),
    about = "Tunefleet agent: runs trials under system parameters and measures them",
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Broker URL, mqtt://HOST:PORT (required to run as an agent); several,
    /// separated by commas, are tried in turn (coordinators that fail over,
    /// each with its embedded broker)
    #[arg(long, env = "TUNEFLEET_BROKER", value_name = "URL")]
    pub broker: Option<String>,
    /// Agent name (default: the host name, sanitised, and 6 hex digits of
    /// this machine's id, so machines imaged alike differ; the bare host name
    /// where an agent of that name already keeps its state)
    #[arg(long, env = "TUNEFLEET_AGENT_NAME")]
    pub name: Option<String>,
    /// A tag announced to the coordinator, KEY=VALUE (repeatable)
    #[arg(long = "tag", value_name = "KEY=VALUE")]
    pub tags: Vec<String>,
    /// Trials run at the same time
    #[arg(long, default_value_t = 1)]
    pub slots: u32,
    /// Trials held ready behind the running ones, started the moment a
    /// slot frees (no round trip to the coordinator between trials); at
    /// most 4 per slot, 0 turns it off. Default: automatic, one per slot,
    /// and for trials shorter than two round trips to the coordinator
    /// (request to assignment; medians of 8) as many as a slot finishes in
    /// two round trips, up to 4
    #[arg(long)]
    pub lookahead: Option<u32>,
    /// Topic root shared with the coordinator
    #[arg(long, env = "TUNEFLEET_ROOT", default_value = DEFAULT_ROOT)]
    pub root: String,
    /// The directory trials run in: relative paths in a study's command
    /// (and in this agent's own flags) are relative to it [default: the
    /// directory the agent was started in]
    #[arg(long, env = "TUNEFLEET_WORKDIR", value_name = "DIR")]
    pub workdir: Option<std::path::PathBuf>,
    /// MQTT keepalive in seconds
    #[arg(long, default_value_t = 5, value_name = "SECS")]
    pub keepalive: u64,
    /// Directory for state kept across restarts (unacknowledged results)
    /// [default: $STATE_DIRECTORY, else $XDG_STATE_HOME or ~/.local/state, /tunefleet-agent/NAME]
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Exit after this many trials have finished and been acknowledged
    #[arg(long, value_name = "N")]
    pub max_trials: Option<u64>,
    /// Exit after being idle (no trial running) this long [default: 30s]
    #[arg(long, value_name = "DURATION", num_args = 0..=1, require_equals = true, default_missing_value = "30s")]
    pub exit_when_idle: Option<String>,
    /// Shutdown grace period (cancel trials, publish results, go offline)
    #[arg(long, default_value = "10s", value_name = "DURATION")]
    pub grace: String,
    /// cgroup v2 mount point used for memory limits
    #[arg(long, default_value = CGROUP_ROOT, value_name = "DIR")]
    pub cgroup_root: PathBuf,
    /// Interval between energy and counter samples while a trial runs
    #[arg(long, default_value = "1s", value_name = "DURATION")]
    pub sample_interval: String,
    /// Interval between telemetry messages (CPU, memory, power, load from
    /// outside the trials); each is checked for interference with the
    /// trials running
    #[arg(long, default_value = "1s", value_name = "DURATION")]
    pub telemetry_interval: String,
    /// Confine the agent, its trials and its load measurement to these CPUs
    /// (a list such as 0-3 or 2,5-7), so several agents can share a machine
    /// [default: every CPU this process may use]
    #[arg(long, env = "TUNEFLEET_CPUS", value_name = "LIST")]
    pub cpus: Option<String>,
    /// Flag a trial's measurement when load from outside the trial (other
    /// processes than the agent's trials and itself) exceeded this fraction
    /// of the agent's CPUs in a telemetry sample taken while it ran
    #[arg(long, default_value_t = DEFAULT_INTERFERENCE_THRESHOLD, value_name = "FRACTION")]
    pub interference_threshold: f64,
    /// The coordinator's public key (64 hex digits, from `tunefleet key`): the
    /// agent obeys only the coordinator holding it
    #[arg(long, env = "TUNEFLEET_COORDINATOR_KEY", value_name = "HEX")]
    pub coordinator_key: Option<String>,
    /// Join token from `tunefleet token create`: the agent pins the
    /// coordinator it names and proves the token in its first Hello. Prefer
    /// TUNEFLEET_JOIN or --join-file: a command line is visible to `ps`
    #[arg(long, env = "TUNEFLEET_JOIN", value_name = "TOKEN", hide_env_values = true)]
    pub join: Option<String>,
    /// Read the join token from this file
    #[arg(long, value_name = "FILE", conflicts_with = "join")]
    pub join_file: Option<PathBuf>,
    /// Pin whichever coordinator's signed status arrives first (trust on
    /// first use): any broker user can be that coordinator. For a lab only
    #[arg(long)]
    pub trust_first_coordinator: bool,
    /// Run only programs (the first word of the command, as the study writes it) matching this
    /// shell-style pattern (repeatable) [default: any program]
    #[arg(long = "allow-command", value_name = "PATTERN")]
    pub allow_commands: Vec<String>,
    /// Under --allow-command, let a study set this variable although it changes what a program
    /// runs or loads (BASH_ENV, PATH, LD_*, PYTHONPATH, ...; repeatable) [default: none]
    #[arg(long = "allow-env", value_name = "NAME")]
    pub allow_env: Vec<String>,
    /// Take no trials while on battery below this charge, in percent (0: no check)
    #[arg(long, default_value_t = DEFAULT_MIN_BATTERY, value_name = "PERCENT")]
    pub min_battery: f64,
    /// Thermal zones and cooling devices root (throttling, temperature)
    #[arg(long, default_value = THERMAL_ROOT, value_name = "DIR")]
    pub thermal_root: PathBuf,
    /// CPU sysfs root (x86 thermal_throttle counters)
    #[arg(long, default_value = CPU_ROOT, value_name = "DIR")]
    pub cpu_sysfs_root: PathBuf,
    #[command(flatten)]
    pub energy: EnergyArgs,
    #[command(flatten)]
    pub security: crate::security::SecurityArgs,
}

/// Which agent's state directory a subcommand looks at.
#[derive(Debug, Clone, Args)]
pub struct StateArgs {
    /// Agent name (default: the host name, sanitised)
    #[arg(long, global = true)]
    pub name: Option<String>,
    /// The agent's state directory
    /// [default: $STATE_DIRECTORY, else $XDG_STATE_HOME or ~/.local/state, /tunefleet-agent/NAME]
    #[arg(long, value_name = "DIR", global = true)]
    pub state_dir: Option<PathBuf>,
}

/// What `spool` does.
#[derive(Debug, Clone, Copy, Subcommand)]
pub enum SpoolAction {
    /// List results awaiting an acknowledgement and results kept aside (the default)
    List,
    /// Move results kept aside back, to be delivered on the next run (to the coordinator that runs their study)
    Requeue,
}

/// Where energy comes from; shared by the agent and its subcommands.
#[derive(Debug, Clone, Args)]
pub struct EnergyArgs {
    /// Energy estimate: watts per pinned core while idle
    #[arg(long, default_value_t = 1.0, value_name = "WATTS")]
    pub idle_watts_per_core: f64,
    /// Energy estimate: watts per core-second of CPU time
    #[arg(long, default_value_t = 4.0, value_name = "WATTS")]
    pub busy_watts_per_core: f64,
    /// RAPL powercap root
    #[arg(long, default_value = POWERCAP_ROOT, value_name = "DIR")]
    pub powercap_root: PathBuf,
    /// hwmon root
    #[arg(long, default_value = HWMON_ROOT, value_name = "DIR")]
    pub hwmon_root: PathBuf,
    /// Battery (power_supply) root
    #[arg(long, default_value = POWER_SUPPLY_ROOT, value_name = "DIR")]
    pub power_supply_root: PathBuf,
    /// NVML, the NVIDIA driver's library, for GPU energy (default: libnvidia-ml.so.1 where the driver installs it)
    #[arg(long, value_name = "FILE")]
    pub nvml_lib: Option<PathBuf>,
    /// External meter: a shell command printing watts or joules (a PDU, a
    /// smart plug), e.g. "12.5 W" or {"joules": 3600}; used instead of the
    /// sources found here
    #[arg(long, value_name = "CMD", conflicts_with = "energy_url")]
    pub energy_command: Option<String>,
    /// External meter: a plain http:// URL answering watts or joules
    #[arg(long, value_name = "URL")]
    pub energy_url: Option<String>,
    /// What a bare number from the external meter means: watts (power,
    /// integrated over time) or joules (a cumulative counter)
    #[arg(long, default_value = "watts", value_parser = ["watts", "joules"], value_name = "UNIT")]
    pub energy_unit: String,
    /// Longest an external meter reading may take
    #[arg(long, default_value = "2s", value_name = "DURATION")]
    pub energy_timeout: String,
}

/// The subcommands usable without a coordinator.
#[derive(Debug, Clone, Subcommand)]
pub enum Command {
    /// Show what this machine offers: energy sources, perf counters, cores, memory
    Probe {
        /// Print JSON instead of a table
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        energy: EnergyArgs,
    },
    /// Run a command once and report time, energy per domain and counters
    Measure {
        /// Interval between energy and counter samples
        #[arg(long, default_value = "1s", value_name = "DURATION")]
        interval: String,
        /// Print the report as one line of JSON (on standard error)
        #[arg(long)]
        json: bool,
        /// Also write the report as JSON to FILE (standard error still shows it)
        #[arg(short, long, value_name = "FILE")]
        output: Option<PathBuf>,
        #[command(flatten)]
        energy: EnergyArgs,
        /// The command and its arguments (after --)
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true, value_name = "CMD")]
        command: Vec<String>,
    },
    /// Print this agent's public key (created when missing), for `tunefleet agents trust`
    Key {
        #[command(flatten)]
        state: StateArgs,
    },
    /// Show the results this agent keeps: awaiting an acknowledgement, and kept aside (refused by a coordinator)
    Spool {
        #[command(subcommand)]
        action: Option<SpoolAction>,
        #[command(flatten)]
        state: StateArgs,
    },
}
