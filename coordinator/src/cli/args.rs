//! The `tunefleet` command line as clap parses it: the top-level [`Cli`],
//! its [`Command`]s and the flag groups they share. Definitions only: what
//! a command does is in the module of its group ([`super::run`],
//! [`super::fleet`], [`super::results`], [`super::demo`], [`super::docs`]),
//! and how flags become a [`crate::RunConfig`] in [`super::wiring`].

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::builder::NonEmptyStringValueParser;
use clap::{Args, Parser, Subcommand, ValueEnum};
use tunefleet_common::security::SecurityArgs;
use tunefleet_common::BrokerUrl;

use crate::runtime::sink::InfluxUrl;

/// Tunefleet coordinator: runs tuning studies on a fleet of agents over MQTT.
#[derive(Debug, Parser)]
#[command(name = "tunefleet", version = tunefleet_common::version(), about, propagate_version = true)]
pub struct Cli {
    /// Defaults for any flag, by its long name (TOML); flags and their
    /// environment variables win over it. Default:
    /// $XDG_CONFIG_HOME/tunefleet/config.toml when it exists.
    #[arg(long, global = true, env = "TUNEFLEET_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a study from start to finish (resumes it if the store has it already).
    Run(Box<RunArgs>),
    /// Run every workload of a campaign file, each as its own study, side by
    /// side on the fleet (resumes them if the store has them already).
    Campaign(Box<RunArgs>),
    /// Run the coordinator as a service: the broker, the scheduler and the
    /// store, taking studies from `submit` and `cancel` on a control socket
    /// (mode 0600) until SIGINT/SIGTERM; studies it left unfinished resume.
    Serve(Box<ServeArgs>),
    /// Give a study file to a running `tunefleet serve`: it runs beside the
    /// others on the shared fleet.
    Submit {
        study: PathBuf,
        #[command(flatten)]
        control: ControlArg,
        /// The service's store (its socket is beside it unless --control says).
        #[command(flatten)]
        store: StoreArg,
    },
    /// Put a configuration first in a study a service runs.
    ///
    /// Optuna's `enqueue_trial`: tried before any trial not created yet,
    /// checked as an `[[enqueue]]` entry of its file, kept in the stored
    /// file. Values as in TOML; a word that is not a number or a boolean is
    /// taken as a string (`optimizer=adam lr=0.01 layers=3`).
    Enqueue {
        study: String,
        /// PARAMETER=VALUE, one or more.
        #[arg(required = true, value_name = "PARAMETER=VALUE")]
        params: Vec<String>,
        #[command(flatten)]
        control: ControlArg,
        /// The service's store (its socket is beside it unless --control says).
        #[command(flatten)]
        store: StoreArg,
    },
    /// Cancel a study on a running `tunefleet serve`: no more trials, and
    /// its running attempts are stopped on their agents.
    Cancel {
        study: String,
        #[command(flatten)]
        control: ControlArg,
        /// The service's store (its socket is beside it unless --control says).
        #[command(flatten)]
        store: StoreArg,
    },
    /// Where each study stands (trials done, running, best so far), from
    /// the store; `--watch` adds the pace and the time left.
    Status {
        study: Option<String>,
        /// Look again every second (plain lines when not on a terminal).
        #[arg(long)]
        watch: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        store: StoreArg,
    },
    /// Run the bundled example study on an embedded broker with two local agents.
    Demo(DemoArgs),
    /// Check a study file and print its trials without running anything.
    Check {
        /// The study file (TOML).
        study: PathBuf,
    },
    /// Create, list and revoke join tokens: an agent given one (--join)
    /// pins this coordinator and is admitted.
    Token {
        #[command(subcommand)]
        action: TokenAction,
        #[command(flatten)]
        store: StoreArg,
    },
    /// List the agents the store has seen, or change whose keys it trusts.
    Agents {
        #[command(subcommand)]
        action: Option<AgentsAction>,
        /// Print the list as JSON (the store's rows) instead of text.
        #[arg(long)]
        json: bool,
        /// Look again every second (a redrawn screen on a terminal, the
        /// list again when it changed otherwise).
        #[arg(long)]
        watch: bool,
        #[command(flatten)]
        store: StoreArg,
    },
    /// Print the coordinator's public key (give it to agents as --coordinator-key), creating the key when missing.
    Key {
        #[command(flatten)]
        key: KeyArg,
    },
    /// Move a store between backends: `copy FROM TO` (a SQLite file, a postgres:// URL).
    Store {
        #[command(subcommand)]
        action: StoreAction,
    },
    /// List the studies in the store; `rename` and `delete` one.
    Studies {
        #[command(subcommand)]
        action: Option<StudiesAction>,
        /// Print JSON (the store's rows) instead of text.
        #[arg(long, global = true)]
        json: bool,
        #[command(flatten)]
        store: StoreArg,
    },
    /// Show the N best trials of a study, or its Pareto front.
    Best {
        study: String,
        /// How many.
        #[arg(short = 'n', long, default_value_t = 5)]
        n: usize,
        /// The Pareto front of the objective and the study's `objective.also`
        /// (energy when it names none): every trial no other beats on all of them.
        #[arg(long)]
        pareto: bool,
        /// The N best per device class (architecture, cores, energy source):
        /// a study run on phones, Graviton and x86 at once ranks each apart.
        #[arg(long, conflicts_with = "pareto")]
        by_class: bool,
        /// Print JSON instead of text: an object whose `view` says which
        /// (`ranked`, `configurations`, `pareto`, `by_class`).
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        store: StoreArg,
    },
    /// Write a self-contained HTML report of a study (charts, device
    /// classes, the best configurations and where their figures came from).
    Report {
        study: String,
        /// The HTML file to write.
        #[arg(short, long, value_name = "FILE")]
        output: PathBuf,
        /// How many best configurations to list.
        #[arg(short = 'n', long, default_value_t = 10)]
        n: usize,
        #[command(flatten)]
        store: StoreArg,
    },
    /// Workload profiles: the clusters of each device class, their members
    /// and best configurations; `decisions` and `classify` say what reuse did
    /// and would do.
    Profiles {
        #[command(subcommand)]
        action: Option<ProfilesAction>,
        /// Print JSON instead of text.
        #[arg(long, global = true)]
        json: bool,
        #[command(flatten)]
        store: StoreArg,
    },
    /// Export every trial of a study.
    Export {
        study: String,
        #[arg(long, value_enum, default_value_t = Format::Csv)]
        format: Format,
        /// Write here instead of stdout.
        #[arg(short, long)]
        output: Option<PathBuf>,
        #[command(flatten)]
        store: StoreArg,
    },
    /// Print a shell completion script, generated from these flags, e.g.
    /// `tunefleet completions bash > ~/.local/share/bash-completion/completions/tunefleet`.
    Completions {
        /// The shell the script is for.
        shell: crate::cli::manual::Shell,
        /// For `tunefleet-agent` instead.
        #[arg(long)]
        agent: bool,
    },
    /// Print the man page, or write it and one page per subcommand
    /// (tunefleet.1, tunefleet-run.1, ...) into DIR.
    Man {
        /// The directory to write the pages into (created when missing).
        #[arg(short, long, value_name = "DIR")]
        output: Option<PathBuf>,
        /// The pages of `tunefleet-agent` instead.
        #[arg(long)]
        agent: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum StudiesAction {
    /// Give study OLD the name NEW: its trials, results and measurements
    /// stay readable under NEW, and OLD is free for a fixed study file run
    /// from the start.
    Rename { old: String, new: String },
    /// Delete STUDY and everything the store holds of it (trials, results,
    /// progress, measurements, the profiles learnt from it).
    Delete { study: String },
}

#[derive(Debug, Subcommand)]
pub enum ProfilesAction {
    /// Every reuse decision (of STUDY, or of every study): reused or
    /// probed, the cluster, distance and threshold, and whether a reused
    /// configuration kept its promise.
    Decisions { study: Option<String> },
    /// Where TRIAL of STUDY would land in its device class's clusters now, and why.
    Classify { study: String, trial: u64 },
    /// Drop the window profiles learnt from agent NAME's results from the
    /// reuse model (a member no longer trusted); its classes' clusters are
    /// fitted again on the rest.
    Forget {
        #[arg(long, value_name = "NAME")]
        agent: String,
    },
}

/// The names a join token admits unless `--uses` says otherwise.
pub const DEFAULT_TOKEN_USES: u64 = 10;

#[derive(Debug, Subcommand)]
pub enum TokenAction {
    /// Print a new join token (give it to agents as --join, TUNEFLEET_JOIN or --join-file).
    Create {
        /// How long it admits new agents (e.g. 30m, 24h, 7d; 0: for ever).
        #[arg(long, default_value = "24h", value_name = "DURATION")]
        ttl: String,
        /// How many new agent names it admits (a token is never unlimited: one
        /// file would enrol as many names as its holder cares to make).
        #[arg(long, default_value_t = DEFAULT_TOKEN_USES, value_name = "N")]
        uses: u64,
        /// A tag the agents it admits get, whatever they claim (repeatable, key=value).
        #[arg(long = "tag", value_name = "K=V")]
        tags: Vec<String>,
        /// The most slots an agent it admits is given, whatever it announces
        /// [default: the coordinator's --max-slots-per-agent].
        #[arg(long, value_name = "N")]
        slots: Option<u32>,
        /// The most trials an agent it admits holds ahead of its slots
        /// [default: 4 per slot].
        #[arg(long, value_name = "N")]
        lookahead: Option<u32>,
        /// The most GPUs an agent it admits is given, whatever it announces
        /// (0: none) [default: the coordinator's --max-gpus-per-agent].
        #[arg(long, value_name = "N")]
        gpus: Option<u32>,
        /// The most slots all the agents it admits hold at once, together
        /// (a new one online is given what the others leave) [default: its
        /// uses times its --slots].
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
        total_slots: Option<u32>,
        /// The MiB of each study's store all the agents it admits may take
        /// together (results and progress, as `--store-share-mib` counts an
        /// agent's) [default: each its own share only].
        #[arg(long, value_name = "MIB", value_parser = clap::value_parser!(u64).range(1..))]
        total_store_mib: Option<u64>,
        /// Write the token to this file (mode 0600) instead of printing it.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
        #[command(flatten)]
        key: KeyArg,
    },
    /// List the tokens (never their secrets: the store does not keep them).
    List {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Revoke the tokens whose id starts with ID (at least 4 hex digits, from `token list`).
    Revoke { id: String },
}

#[derive(Debug, Subcommand)]
pub enum AgentsAction {
    /// Pin KEY (64 hex digits, from `tunefleet-agent key`) for agent NAME,
    /// replacing the key pinned before: for a re-installed agent, or to
    /// register agents ahead of time.
    Trust {
        name: String,
        key: String,
        /// The most slots it is given, whatever it announces [default: the
        /// coordinator's --max-slots-per-agent].
        #[arg(long, value_name = "N")]
        slots: Option<u32>,
        /// The most trials it holds ahead of its slots [default: 4 per slot].
        #[arg(long, value_name = "N")]
        lookahead: Option<u32>,
        /// The most GPUs it is given, whatever it announces (0: none)
        /// [default: the coordinator's --max-gpus-per-agent].
        #[arg(long, value_name = "N")]
        gpus: Option<u32>,
    },
    /// Forget the key pinned for NAME: its next Hello pins a new one.
    Forget { name: String },
}

#[derive(Debug, Clone, Args)]
pub struct KeyArg {
    /// The coordinator's Ed25519 key (PKCS#8), created when missing
    /// [default: $STATE_DIRECTORY/coordinator.key, else $XDG_STATE_HOME/tunefleet/coordinator.key,
    /// else ~/.local/state/tunefleet/coordinator.key]
    #[arg(long = "identity", env = "TUNEFLEET_IDENTITY", value_name = "FILE")]
    pub path: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Format {
    Csv,
    Json,
    /// An Optuna journal file: `optuna.load_study(storage=JournalStorage(JournalFileBackend(FILE)))`
    /// and optuna-dashboard open it.
    Optuna,
}

#[derive(Debug, Subcommand)]
pub enum StoreAction {
    /// Copy every row of store FROM into the empty store TO (created when
    /// missing), and show each table's rows and digest on both sides.
    Copy {
        /// The store to read: a SQLite file or postgres://USER@HOST:PORT/DB.
        from: PathBuf,
        /// The store to fill: a SQLite file or postgres://USER@HOST:PORT/DB.
        to: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
pub struct StoreArg {
    /// The store: a SQLite file, or postgres://USER@HOST:PORT/DB[?schema=NAME] (the password from
    /// TUNEFLEET_STORE_PASSWORD or the file TUNEFLEET_STORE_PASSWORD_FILE names).
    #[arg(long, env = "TUNEFLEET_STORE", default_value = "tunefleet.db", global = true)]
    pub store: PathBuf,
}

#[derive(Debug, Args)]
pub struct BrokerArgs {
    #[command(flatten)]
    pub launch: crate::runtime::launch::LaunchArgs,
    /// Use this external broker (mqtt://HOST:PORT) instead of the embedded one.
    #[arg(long, env = "TUNEFLEET_BROKER")]
    pub broker: Option<BrokerUrl>,
    /// Where the embedded broker listens (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:1883")]
    pub listen: SocketAddr,
    /// Topic root, so several fleets can share a broker.
    #[arg(long, default_value = tunefleet_common::topic::DEFAULT_ROOT)]
    pub root: String,
    /// MQTT keepalive in seconds.
    #[arg(long, default_value_t = 5)]
    pub keepalive: u64,
    /// Embedded broker: logins besides the agents' keys (lines of user:password, a password agents
    /// must also carry to enrol, or user:password:FILTER,... an operator's tool reading those topics).
    #[arg(long, value_name = "FILE")]
    pub broker_users: Option<PathBuf>,
    /// Embedded broker: listen beyond loopback with neither --broker-users nor TLS, so anyone who
    /// reaches it may connect, ask to enrol and see topic names, sizes and timing.
    #[arg(long)]
    pub broker_open_to_network: bool,
    /// Embedded broker: serve TLS with this certificate (PEM); needs --broker-key and --broker-client-ca.
    #[arg(long, value_name = "FILE", requires_all = ["broker_key", "broker_client_ca"])]
    pub broker_cert: Option<PathBuf>,
    /// Embedded broker: private key (PEM) of --broker-cert.
    #[arg(long, value_name = "FILE", requires = "broker_cert")]
    pub broker_key: Option<PathBuf>,
    /// Embedded broker: CA (PEM) that signs the client certificates it accepts (mutual TLS).
    #[arg(long, value_name = "FILE", requires = "broker_cert")]
    pub broker_client_ca: Option<PathBuf>,
    /// Embedded broker: which code serves it (rumqttd, in builds with the `rumqttd` feature, only to compare).
    #[arg(long, value_enum, default_value = "native", hide = true, env = "TUNEFLEET_EMBEDDED_BROKER")]
    pub embedded_broker: crate::runtime::broker::BrokerEngine,
    /// How to log in to an external broker (--broker).
    #[command(flatten)]
    pub security: SecurityArgs,
    #[command(flatten)]
    pub key: KeyArg,
    /// Most agents whose keys the coordinator pins; Hellos from further new agents are refused.
    #[arg(long, default_value_t = crate::runtime::auth::DEFAULT_MAX_AGENTS, value_name = "N")]
    pub max_agents: u64,
    /// Most slots any agent is given, whatever it announces; a join token's
    /// or `agents trust`'s grant may give less (trials held ahead: at most 4
    /// per slot, or the grant's lookahead).
    #[arg(long, default_value_t = crate::runtime::auth::DEFAULT_MAX_SLOTS, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_slots_per_agent: u32,
    /// Most GPUs any agent is given, whatever it announces; a join token's
    /// or `agents trust`'s grant may give fewer.
    #[arg(long, default_value_t = crate::runtime::auth::DEFAULT_MAX_GPUS, value_name = "N")]
    pub max_gpus_per_agent: u32,
    /// Below this much room on the store's disk (MiB) the coordinator
    /// pauses, taking no message and assigning nothing (agents keep their
    /// results), and goes on once it has twice that; at start it waits for it.
    #[arg(long, default_value_t = crate::runtime::disk::DEFAULT_MIN_FREE_MIB, value_name = "MIB")]
    pub store_min_free_mib: u64,
    /// Most of each study's store one agent's results and progress may take
    /// (MiB, counted as written): past it, they are refused (the agent is
    /// told why) and it is given none of the study's trials, while the
    /// others go on. What one member can add to the store's disk.
    #[arg(long, default_value_t = crate::runtime::disk::DEFAULT_STORE_SHARE_MIB, value_name = "MIB",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub store_share_mib: u64,
    /// Pin the key of any new agent, without a join token: any broker user
    /// can then join the fleet. For a lab only (logged loudly).
    #[arg(long)]
    pub open_enrolment: bool,
    /// Move work off overloaded agents: an agent whose load from outside its
    /// own trials (or memory use) passes the thresholds below gets no trials
    /// and its running ones move to other agents; a measurement an agent
    /// flags as disturbed is taken again elsewhere. Off by default: agents
    /// that share a machine without --cpus load each other.
    #[arg(long)]
    pub offload: bool,
    /// Overloaded when load from outside its trials reaches this share of
    /// its CPUs (averaged over --offload-window).
    #[arg(long, default_value_t = 0.5, value_name = "RATIO")]
    pub offload_cpu: f64,
    /// ... or when this share of its memory is in use.
    #[arg(long, default_value_t = 0.95, value_name = "RATIO")]
    pub offload_memory: f64,
    /// Seconds of telemetry the overload averages are taken over.
    #[arg(long, default_value_t = 3, value_name = "SECONDS")]
    pub offload_window: u64,
}

/// Where results go besides the store. No URL: no InfluxDB output.
#[derive(Args)]
pub struct InfluxArgs {
    /// Also write energy, power and per-trial summaries to this InfluxDB v2 server (http://HOST:8086).
    #[arg(long, env = "TUNEFLEET_INFLUX_URL", value_name = "URL")]
    pub influx_url: Option<InfluxUrl>,
    /// InfluxDB organisation.
    #[arg(long, env = "TUNEFLEET_INFLUX_ORG", default_value = "tunefleet", value_name = "ORG")]
    #[arg(value_parser = NonEmptyStringValueParser::new())]
    pub influx_org: String,
    /// InfluxDB bucket.
    #[arg(long, env = "TUNEFLEET_INFLUX_BUCKET", default_value = "tunefleet", value_name = "BUCKET")]
    #[arg(value_parser = NonEmptyStringValueParser::new())]
    pub influx_bucket: String,
    /// InfluxDB API token (prefer the environment variable: flags show in `ps`).
    #[arg(long, env = "TUNEFLEET_INFLUX_TOKEN", hide_env_values = true, value_name = "TOKEN")]
    pub influx_token: Option<String>,
    /// On exit, how long to keep delivering points still waiting (they stay in the store otherwise).
    #[arg(long, default_value_t = 10, value_name = "SECONDS")]
    pub influx_grace: u64,
}

impl std::fmt::Debug for InfluxArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InfluxArgs")
            .field("influx_url", &self.influx_url)
            .field("influx_org", &self.influx_org)
            .field("influx_bucket", &self.influx_bucket)
            .field("influx_token", &self.influx_token.as_ref().map(|_| "<hidden>"))
            .field("influx_grace", &self.influx_grace)
            .finish()
    }
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The study file (TOML); for `campaign`, the campaign file.
    pub study: PathBuf,
    #[command(flatten)]
    pub broker: BrokerArgs,
    #[command(flatten)]
    pub influx: InfluxArgs,
    #[command(flatten)]
    pub store: StoreArg,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub broker: BrokerArgs,
    /// The live page (read only: the fleet, the studies, their reports),
    /// at this address [default: 127.0.0.1:8765, skipped when taken]; `off`
    /// for none. Beyond loopback it needs --page-token-file.
    #[arg(long, value_name = "ADDR")]
    pub page: Option<String>,
    /// A file holding the token the page asks for (`?token=` or
    /// `Authorization: Bearer`, at least 16 characters).
    #[arg(long, value_name = "FILE")]
    pub page_token_file: Option<PathBuf>,
    #[command(flatten)]
    pub influx: InfluxArgs,
    #[command(flatten)]
    pub store: StoreArg,
    #[command(flatten)]
    pub control: ControlArg,
    /// On a PostgreSQL store: how long this service's lease runs without a
    /// renewal (it renews every third of it) before a standby serving the
    /// same store takes over; at least 3. A service whose renewals have not
    /// landed for that long steps down (exit 7), with or without a standby.
    #[arg(long, value_name = "SECONDS", default_value_t = 15)]
    pub lease_seconds: u64,
}

#[derive(Debug, Args)]
pub struct ControlArg {
    /// The service's control socket (default: `control.sock` in a directory
    /// beside the store, `fleet.control/` for `fleet.db`); its directory is
    /// created with mode 0700, or must be this user's with mode 0700.
    #[arg(long, env = "TUNEFLEET_CONTROL")]
    pub control: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// The store the demo writes (recreated on every run).
    #[arg(long, default_value = "tunefleet-demo.db")]
    pub store: PathBuf,
    /// How many local agents to start.
    #[arg(long, default_value_t = 2)]
    pub agents: u32,
    #[command(flatten)]
    pub influx: InfluxArgs,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
}
