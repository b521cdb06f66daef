//! The `tunefleet` command line: flags parsed by clap, then one function per
//! subcommand. Every subcommand that reads results takes `--store PATH`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::builder::NonEmptyStringValueParser;
use clap::{Args, Parser, Subcommand, ValueEnum};
use tunefleet_common::security::{SecurityArgs, PASSWORD_ENV};
use tunefleet_common::topic::Topics;
use tunefleet_common::BrokerUrl;

use crate::best::{mixed_sources, unranked_note};
use crate::broker::{self, BrokerSettings, BrokerTls};
use crate::engine::Summary;
use crate::run::{BrokerChoice, RunConfig};
use crate::sink::{InfluxUrl, SinkConfig};
use crate::store::{BestRow, ExportFormat, Store};
use crate::study::{self, Study};

/// The demo study, bundled so `tunefleet demo` works from any directory.
pub const DEMO_STUDY: &str = include_str!("../../examples/studies/demo.toml");

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
    /// List the studies in the store.
    Studies {
        /// Print JSON (the store's rows) instead of text.
        #[arg(long)]
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
        shell: crate::manual::Shell,
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

#[derive(Debug, Subcommand)]
pub enum TokenAction {
    /// Print a new join token (give it to agents as --join, TUNEFLEET_JOIN or --join-file).
    Create {
        /// How long it admits new agents (e.g. 30m, 24h, 7d; 0: for ever).
        #[arg(long, default_value = "24h", value_name = "DURATION")]
        ttl: String,
        /// How many new agents it admits [default: any number until it expires].
        #[arg(long, value_name = "N")]
        uses: Option<u64>,
        /// A tag the agents it admits get, whatever they claim (repeatable, key=value).
        #[arg(long = "tag", value_name = "K=V")]
        tags: Vec<String>,
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
    Trust { name: String, key: String },
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

impl KeyArg {
    /// The key file to use with the store at `store`.
    pub fn resolve(&self, store: &Path) -> PathBuf {
        self.path.clone().unwrap_or_else(|| {
            let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
            crate::auth::default_key_path(store, env("STATE_DIRECTORY"), env("XDG_STATE_HOME"), env("HOME"))
        })
    }

    /// Loads the key, creating it (and saying so) when missing.
    pub fn load(&self, store: &Path) -> anyhow::Result<tunefleet_common::auth::Identity> {
        let path = self.resolve(store);
        let (identity, created) = tunefleet_common::auth::Identity::load_or_create(&path)?;
        if created {
            tracing::warn!(path = %path.display(), key = %tunefleet_common::auth::hex(&identity.public()), "created the coordinator's key");
        }
        Ok(identity)
    }
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Format {
    Csv,
    Json,
}

#[derive(Debug, Args)]
pub struct StoreArg {
    /// The local store (SQLite).
    #[arg(long, env = "TUNEFLEET_STORE", default_value = "tunefleet.db", global = true)]
    pub store: PathBuf,
}

#[derive(Debug, Args)]
pub struct BrokerArgs {
    #[command(flatten)]
    pub launch: crate::launch::LaunchArgs,
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
    /// Embedded broker: require these logins (a file of user:password lines).
    #[arg(long, value_name = "FILE")]
    pub broker_users: Option<PathBuf>,
    /// Embedded broker: serve TLS with this certificate (PEM); needs --broker-key and --broker-client-ca.
    #[arg(long, value_name = "FILE", requires_all = ["broker_key", "broker_client_ca"])]
    pub broker_cert: Option<PathBuf>,
    /// Embedded broker: private key (PEM) of --broker-cert.
    #[arg(long, value_name = "FILE", requires = "broker_cert")]
    pub broker_key: Option<PathBuf>,
    /// Embedded broker: CA (PEM) that signs the client certificates it accepts (mutual TLS).
    #[arg(long, value_name = "FILE", requires = "broker_cert")]
    pub broker_client_ca: Option<PathBuf>,
    /// How to log in to an external broker (--broker).
    #[command(flatten)]
    pub security: SecurityArgs,
    #[command(flatten)]
    pub key: KeyArg,
    /// Most agents whose keys the coordinator pins; Hellos from further new agents are refused.
    #[arg(long, default_value_t = crate::auth::DEFAULT_MAX_AGENTS, value_name = "N")]
    pub max_agents: u64,
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

impl BrokerArgs {
    /// The overload policy of these flags (`None` without --offload).
    pub fn offload(&self) -> anyhow::Result<Option<crate::offload::Policy>> {
        if !self.offload {
            return Ok(None);
        }
        for (name, v) in [("--offload-cpu", self.offload_cpu), ("--offload-memory", self.offload_memory)] {
            if !(v > 0.0 && v <= 1.0) {
                bail!("{name} must be in (0, 1], not {v}");
            }
        }
        if self.offload_window == 0 {
            bail!("--offload-window must be at least 1 second");
        }
        Ok(Some(crate::offload::Policy {
            cpu_ratio: self.offload_cpu,
            memory_ratio: self.offload_memory,
            window_ms: self.offload_window.saturating_mul(1000),
            ..crate::offload::Policy::default()
        }))
    }
}

impl BrokerArgs {
    /// The embedded broker's settings, unless `--broker` names an external one.
    fn choice(&self) -> anyhow::Result<BrokerChoice> {
        if let Some(url) = &self.broker {
            let password = std::env::var(PASSWORD_ENV).ok();
            let security = self.security.resolve(url, password)?;
            return Ok(BrokerChoice::External { url: url.clone(), security });
        }
        let users = self.broker_users.as_deref().map(broker::read_users).transpose().map_err(anyhow::Error::msg)?;
        let tls = match (&self.broker_cert, &self.broker_key, &self.broker_client_ca) {
            (Some(cert), Some(key), Some(client_ca)) => {
                Some(BrokerTls { cert: cert.clone(), key: key.clone(), client_ca: client_ca.clone() })
            }
            _ => None,
        };
        if !self.listen.ip().is_loopback() && users.is_none() && tls.is_none() {
            eprintln!(
                "WARNING: the embedded broker listens on {} with no login and no TLS: anyone who reaches it can join \
                 the fleet or send it data. Use --broker-users and/or --broker-cert.",
                self.listen
            );
        }
        Ok(BrokerChoice::Embedded(BrokerSettings { listen: self.listen, users, nodelay: true, tls }))
    }
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

impl InfluxArgs {
    /// The sink settings, when a URL is given.
    pub fn config(&self) -> Option<SinkConfig> {
        let url = self.influx_url.clone()?;
        let token = self.influx_token.clone().filter(|t| !t.is_empty());
        Some(SinkConfig::new(url, &self.influx_org, &self.influx_bucket, token))
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
    #[command(flatten)]
    pub influx: InfluxArgs,
    #[command(flatten)]
    pub store: StoreArg,
    #[command(flatten)]
    pub control: ControlArg,
}

#[derive(Debug, Args)]
pub struct ControlArg {
    /// The service's control socket (default: `control.sock` in a directory
    /// beside the store, `fleet.control/` for `fleet.db`); its directory is
    /// created with mode 0700, or must be this user's with mode 0700.
    #[arg(long, env = "TUNEFLEET_CONTROL")]
    pub control: Option<PathBuf>,
}

impl ControlArg {
    /// The socket path: given, or beside `store`.
    pub fn resolve(&self, store: &Path) -> PathBuf {
        self.control.clone().unwrap_or_else(|| crate::control::default_path(store))
    }
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

/// Runs one subcommand.
pub async fn execute(cli: Cli, shutdown: impl std::future::Future<Output = ()>) -> anyhow::Result<()> {
    match cli.command {
        Command::Run(args) => {
            let study = study::load(&args.study)?;
            // A study with [[group]]s runs as one study per group, side by side.
            let summaries =
                run_studies(study.expand(), &args.broker, &args.influx, &args.store.store, !args.quiet, None, shutdown)
                    .await?;
            for summary in &summaries {
                print_summary(summary, &args.store.store);
            }
            Ok(())
        }
        Command::Campaign(args) => {
            let campaign = crate::campaign::load(&args.study)?;
            let name = campaign.name.clone();
            let studies: Vec<Study> = campaign.studies.iter().flat_map(Study::expand).collect();
            let summaries =
                run_studies(studies, &args.broker, &args.influx, &args.store.store, !args.quiet, None, shutdown)
                    .await?;
            for s in &summaries {
                print_summary(s, &args.store.store);
            }
            let (done, total) = summaries.iter().fold((0, 0), |(d, t), s| (d + s.done, t + s.total));
            let finished = summaries.iter().filter(|s| s.done + s.failed + s.stopped == s.total).count();
            // Scripts read this line.
            println!("campaign {name}: {finished}/{} workloads finished, {done}/{total} trials done", summaries.len());
            Ok(())
        }
        Command::Serve(args) => {
            let control = args.control.resolve(&args.store.store);
            // Scripts and tests read this line; the socket exists once the broker is up.
            println!("control: {}", control.display());
            let summaries =
                run_studies(Vec::new(), &args.broker, &args.influx, &args.store.store, true, Some(control), shutdown)
                    .await?;
            for s in &summaries {
                print_summary(s, &args.store.store);
            }
            Ok(())
        }
        Command::Submit { study, control, store } => {
            let text = std::fs::read_to_string(&study).with_context(|| format!("reading {}", study.display()))?;
            // Checked here too, so a mistake is reported with its line before anything is sent.
            study::parse(&text, &study.display().to_string())?;
            let ask = crate::control::Ask::Submit { study: text, origin: study.display().to_string() };
            answer(crate::control::ask(&control.resolve(&store.store), &ask).await?)
        }
        Command::Cancel { study, control, store } => {
            let ask = crate::control::Ask::Cancel { study };
            answer(crate::control::ask(&control.resolve(&store.store), &ask).await?)
        }
        Command::Status { study, watch, json, store } => {
            status(&store.store, study.as_deref(), watch, json, shutdown).await
        }
        Command::Demo(args) => demo(args, shutdown).await,
        Command::Check { study } => {
            let file = study::load(&study)?;
            let mut out = String::new();
            for study in file.expand() {
                check_one(&study, &mut out)?;
            }
            emit(&out)
        }
        Command::Key { key } => {
            let identity = key.load(Path::new("tunefleet.db"))?;
            println!("{}", tunefleet_common::auth::hex(&identity.public()));
            Ok(())
        }
        Command::Token { action, store } => token(action, &store.store),
        Command::Agents { action: Some(action), store, .. } => {
            let mut store =
                Store::open(&store.store).with_context(|| format!("opening the store {}", store.store.display()))?;
            let now = unix_now_ms();
            match action {
                AgentsAction::Trust { name, key } => {
                    tunefleet_common::topic::validate_agent_id(&name)?;
                    let Some(key) = tunefleet_common::auth::parse_public_key(&key) else {
                        bail!("not a public key: give the 64 hex digits that `tunefleet-agent key` prints")
                    };
                    match store.trust_agent(&name, &key, now)? {
                        Some(old) if old != key => println!(
                            "{name}: key {} pinned, replacing {}",
                            tunefleet_common::auth::hex(&key),
                            tunefleet_common::auth::hex(&old)
                        ),
                        _ => println!("{name}: key {} pinned", tunefleet_common::auth::hex(&key)),
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
        Command::Agents { action: None, json, watch, store: s } => {
            let path = s.store.clone();
            let look = move || -> anyhow::Result<String> {
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
        Command::Studies { json, store: s } => {
            let store = open_existing(&s.store)?;
            if json {
                return emit_json(&store.studies()?);
            }
            let mut out = String::new();
            for st in store.studies()? {
                writeln!(out, "{:<24} {:<9} {}/{} done, {} failed", st.name, st.state, st.done, st.total, st.failed)?;
            }
            emit(&out)
        }
        Command::Best { study, n, pareto, by_class, json, store } => {
            let store = open_existing(&store.store)?;
            let ask = match (pareto, by_class) {
                (true, _) => crate::best::Ask::Pareto,
                (false, true) => crate::best::Ask::ByClass,
                (false, false) => crate::best::Ask::Best,
            };
            let view = crate::best::view(&store, &study, n, ask)?;
            if json {
                emit_json(&view)
            } else {
                emit(&view.render()?)
            }
        }
        Command::Profiles { action, json, store } => {
            let path = store.store;
            let text = match action {
                None => {
                    let store = open_existing(&path)?;
                    let views = crate::profiles::classes(&store)?;
                    if json {
                        serde_json::to_string_pretty(&views)?
                    } else {
                        crate::profiles::render_classes(&views)
                    }
                }
                Some(ProfilesAction::Decisions { study }) => {
                    let rows = open_existing(&path)?.decisions(study.as_deref())?;
                    if json {
                        serde_json::to_string_pretty(&rows)?
                    } else {
                        crate::profiles::render_decisions(&rows)
                    }
                }
                Some(ProfilesAction::Classify { study, trial }) => {
                    let c = crate::profiles::classify(&open_existing(&path)?, &study, trial)?;
                    if json {
                        serde_json::to_string_pretty(&c)?
                    } else {
                        crate::profiles::render_classified(&c)
                    }
                }
                Some(ProfilesAction::Forget { agent }) => {
                    if !path.exists() {
                        bail!("no store at {} (give --store PATH)", path.display());
                    }
                    let mut store =
                        Store::open(&path).with_context(|| format!("opening the store {}", path.display()))?;
                    let now = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_millis() as u64);
                    let forgotten = crate::profiles::forget(&mut store, &agent, now)?;
                    if json {
                        serde_json::to_string_pretty(&forgotten)?
                    } else {
                        crate::profiles::render_forgotten(&agent, &forgotten)
                    }
                }
            };
            emit(&text)?;
            if json {
                emit("\n")?;
            }
            Ok(())
        }
        Command::Report { study, output, n, store } => {
            let store = open_existing(&store.store)?;
            let options = crate::report::Options { best: n, ..crate::report::Options::default() };
            let bytes = crate::report::write(&store, &study, options, &output)?;
            // Scripts and tests read this line.
            println!("report: {} ({bytes} bytes)", output.display());
            Ok(())
        }
        Command::Export { study, format, output, store } => {
            let store = open_existing(&store.store)?;
            let format = match format {
                Format::Csv => ExportFormat::Csv,
                Format::Json => ExportFormat::Json,
            };
            match output {
                Some(path) => {
                    let mut f = std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
                    store.export(&study, format, &mut f)?;
                }
                None => store.export(&study, format, &mut std::io::stdout().lock())?,
            }
            Ok(())
        }
        Command::Completions { shell, agent } => {
            let program = if agent { crate::manual::Program::Agent } else { crate::manual::Program::Coordinator };
            emit_bytes(&crate::manual::completions(program, shell))
        }
        Command::Man { output, agent } => {
            let program = if agent { crate::manual::Program::Agent } else { crate::manual::Program::Coordinator };
            match output {
                None => emit_bytes(&crate::manual::page(program)),
                Some(dir) => {
                    for path in crate::manual::write_pages(program, &dir)? {
                        println!("{}", path.display());
                    }
                    Ok(())
                }
            }
        }
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

/// Writes a command's output to stdout; a reader that went away (`| head`) ends it quietly.
fn emit(text: &str) -> anyhow::Result<()> {
    emit_bytes(text.as_bytes())
}

/// [`emit`] for bytes (a completion script, a man page).
fn emit_bytes(bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write as _;
    match std::io::stdout().lock().write_all(bytes) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}

/// [`emit`] of `value` as JSON (`--json`): pretty, ending with a newline.
fn emit_json(value: &impl serde::Serialize) -> anyhow::Result<()> {
    emit(&format!("{}\n", serde_json::to_string_pretty(value)?))
}

fn open_existing(path: &Path) -> anyhow::Result<Store> {
    if !path.exists() {
        bail!("no store at {} (give --store PATH)", path.display());
    }
    Ok(Store::open_read_only(path)?)
}

/// Runs `study` through [`crate::run::run`] with the flags' settings, and
/// prints what scripts read: the broker URL first, the InfluxDB figures last.
pub async fn run_study(
    study: Study,
    args: &BrokerArgs,
    influx: &InfluxArgs,
    store_path: &Path,
    progress: bool,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<Summary> {
    let mut summaries = run_studies(vec![study], args, influx, store_path, progress, None, shutdown).await?;
    summaries.pop().context("the run ended without a summary")
}

/// Runs `studies` side by side (a campaign), or as a service taking
/// studies on the `control` socket until `shutdown` (`tunefleet serve`);
/// see [`run_study`].
pub async fn run_studies(
    studies: Vec<Study>,
    args: &BrokerArgs,
    influx: &InfluxArgs,
    store_path: &Path,
    progress: bool,
    control: Option<PathBuf>,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<Vec<Summary>> {
    let config = RunConfig {
        studies,
        broker: args.choice()?,
        topics: Topics::new(&args.root)?,
        keepalive: Duration::from_secs(args.keepalive),
        store: store_path.to_path_buf(),
        identity: args.key.resolve(store_path),
        max_agents: args.max_agents,
        open_enrolment: args.open_enrolment,
        influx: influx.config().map(|c| (c, Duration::from_secs(influx.influx_grace))),
        progress,
        offload: args.offload()?,
        // Scripts and tests read this line to find a broker on a port the OS chose.
        on_broker: Some(Box::new(|url| println!("broker: {url}"))),
        launch: Some(args.launch.clone()),
        control,
    };
    let outcome = crate::run::run(config, shutdown).await?;
    if let Some(stats) = outcome.influx {
        // Scripts and tests read this line.
        println!(
            "influx: {} points delivered, {} waiting in the store, {} refused",
            stats.delivered, stats.waiting, stats.parked
        );
        if stats.waiting > 0 {
            tracing::warn!(
                waiting = stats.waiting,
                error = stats.last_error.as_deref().unwrap_or("none"),
                "InfluxDB points not delivered yet; the next run with this store delivers them"
            );
        }
    }
    Ok(outcome.summaries)
}

/// `tunefleet check`: one study's trials (or how many an adaptive search may make).
fn check_one(study: &Study, out: &mut String) -> anyhow::Result<()> {
    if crate::search::Search::adaptive(study) {
        let planned = crate::search::Search::new(study).planned();
        writeln!(
            out,
            "{}: up to {planned} trials chosen as the study goes (adaptive), objective {} ({})",
            study.name,
            study.objective.metric,
            study.objective.direction.as_str()
        )?;
        return Ok(());
    }
    let plans = crate::search::plan(study);
    writeln!(
        out,
        "{}: {} trials, objective {} ({})",
        study.name,
        plans.len(),
        study.objective.metric,
        study.objective.direction.as_str()
    )?;
    for p in &plans {
        let params: Vec<String> = p.params.iter().map(|(k, v)| format!("{k}={v}")).collect();
        writeln!(out, "  trial {:>4} repeat {}: {}", p.trial, p.repeat, params.join(" "))?;
    }
    Ok(())
}

/// `tunefleet agents` as text: each agent's class, load, conditions and trials.
fn agents_text(store: &Store) -> anyhow::Result<String> {
    let mut out = String::new();
    writeln!(
        out,
        "{:<24} {:<8} {:>5} {:>9} {:>5} {:<10} {:<20} {:>8} {:<22} {:<28} tags",
        "agent", "arch", "cores", "mem GiB", "slots", "energy", "last status", "outside", "conditions", "running"
    )?;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
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
        let running = if a.running.is_empty() { "-".to_string() } else { a.running.join(" ") };
        writeln!(
            out,
            "{:<24} {:<8} {:>5} {:>9.1} {:>5} {:<10} {:<20} {:>8} {:<22} {:<28} {}",
            a.info.agent,
            a.info.arch,
            a.info.cores,
            a.info.memory_bytes as f64 / (1u64 << 30) as f64,
            a.info.slots,
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

/// Shows `next()` now and every second until `shutdown`: redrawn on a
/// terminal, printed again when it changed otherwise (CI, systemd).
async fn watch_text(
    mut next: impl FnMut() -> anyhow::Result<String>,
    json: bool,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    use std::io::IsTerminal as _;
    let terminal = std::io::stdout().is_terminal() && !json;
    tokio::pin!(shutdown);
    let mut shown = String::new();
    loop {
        let text = next()?;
        if terminal {
            emit(&format!("\x1b[2J\x1b[H{text}"))?;
        } else if text != shown {
            emit(&text)?;
        }
        shown = text;
        tokio::select! {
            _ = &mut shutdown => return Ok(()),
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

/// Prints a service's answer; an error answer is an error.
fn answer(a: crate::control::Answer) -> anyhow::Result<()> {
    match a {
        crate::control::Answer::Ok { message } => {
            println!("{message}");
            Ok(())
        }
        crate::control::Answer::Error { message } => bail!("{message}"),
    }
}

/// `tunefleet status`: once, or every second until `shutdown` (redrawn on
/// a terminal, a line per change otherwise).
async fn status(
    path: &Path,
    study: Option<&str>,
    watch: bool,
    json: bool,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let look = || -> anyhow::Result<Vec<crate::status::StudyStatus>> {
        let rows = crate::status::snapshot(&open_existing(path)?, study)?;
        if rows.is_empty() {
            if let Some(s) = study {
                bail!("no study {s:?} in {}", path.display());
            }
        }
        Ok(rows)
    };
    let show = move |rows: &[crate::status::StudyStatus]| -> anyhow::Result<String> {
        Ok(if json { format!("{}\n", serde_json::to_string(rows)?) } else { crate::status::render(rows) })
    };
    if !watch {
        return emit(&show(&look()?)?);
    }
    // Each look after the first gets the pace since the one before.
    let mut before: Option<(Instant, Vec<crate::status::StudyStatus>)> = None;
    let next = move || -> anyhow::Result<String> {
        let mut now = look()?;
        if let Some((at, prev)) = &before {
            crate::status::pace(prev, &mut now, at.elapsed().as_secs_f64());
        }
        let text = show(&now)?;
        before = Some((Instant::now(), now));
        Ok(text)
    };
    watch_text(next, json, shutdown).await
}

fn print_summary(s: &Summary, store: &Path) {
    let stopped = if s.stopped > 0 { format!(", {} stopped early", s.stopped) } else { String::new() };
    println!(
        "study {}: {}/{} trials done, {} failed{stopped}, in {:.1} s on {} agent(s)",
        s.study,
        s.done,
        s.total,
        s.failed,
        s.elapsed.as_secs_f64(),
        s.agents_seen
    );
    let st = &s.stats;
    let refused = [
        (st.rejected_messages, "malformed messages"),
        (st.bad_tokens, "unauthenticated messages"),
        (st.refused_hellos, "Hellos refused"),
        (st.rate_limited_hellos, "Hellos over the rate limit"),
        (st.forged_wills, "forged Last Wills"),
        (st.invalid_messages, "messages with values out of bounds"),
        (st.store_errors, "messages the store could not take"),
        (st.refused_checkpoints, "checkpoints outside resume_prefix"),
        (st.unknown_results, "results for attempts never assigned"),
        (st.other_study_refs, "messages of another study of the same name"),
    ];
    if refused.iter().any(|(n, _)| *n > 0) {
        // Scripts and tests read this line: "refused: N what, N what, ...".
        let parts: Vec<String> = refused.iter().map(|(n, what)| format!("{n} {what}")).collect();
        println!("refused: {}", parts.join(", "));
    }
    if st.moved > 0 {
        println!("moved: {} attempts off overloaded agents or disturbed measurements", st.moved);
    }
    if st.requeued > 0 || st.duplicate_results > 0 {
        println!("requeued: {} trials; duplicate results acknowledged: {}", st.requeued, st.duplicate_results);
    }
    let ranked = Store::open_read_only(store).and_then(|st| Ok((st.best(&s.study, 3)?, st.unranked(&s.study)?)));
    match ranked {
        Ok((best, unranked)) => {
            if let Some(note) = unranked_note(&unranked) {
                println!("note: {note}");
            }
            if best.is_empty() {
                println!("{}", if unranked.total() > 0 { "no trial to rank" } else { "no successful trial" });
            } else {
                print_best(&best);
            }
        }
        Err(e) => tracing::warn!(error = %e, "cannot read the best trials back"),
    }
    println!("store: {}", store.display());
}

fn print_best(best: &[BestRow]) {
    if let Some(note) = mixed_sources(best.iter().map(|r| r.energy_source.as_deref())) {
        println!("{note}");
    }
    println!("best trials:");
    for r in best {
        let params: Vec<String> = r.params.iter().map(|(k, v)| format!("{k}={v}")).collect();
        println!("  trial {:>4}  {:>10.6}  on {:<16} {}", r.trial, r.objective, r.agent, params.join(" "));
    }
}

/// The demo: embedded broker on a free loopback port, local agent
/// processes, the bundled study.
fn unix_now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// A new join token for the coordinator holding `identity`, kept (its
/// public half) in `store`; returns the token's text.
pub fn new_token(
    store: &mut Store,
    identity: &tunefleet_common::auth::Identity,
    ttl_ms: Option<u64>,
    uses: Option<u64>,
    tags: &BTreeMap<String, String>,
) -> anyhow::Result<String> {
    let token = tunefleet_common::auth::JoinToken::generate(&identity.public())?;
    let now = unix_now_ms();
    store.create_token(&token.public()?, ttl_ms.map(|t| now.saturating_add(t)), uses, tags, now)?;
    Ok(token.to_string())
}

fn token(action: TokenAction, store_path: &Path) -> anyhow::Result<()> {
    let mut store = Store::open(store_path).with_context(|| format!("opening the store {}", store_path.display()))?;
    match action {
        TokenAction::Create { ttl, uses, tags, out, key } => {
            let ttl_ms = match ttl.trim() {
                "0" => None,
                t => Some(
                    crate::launch::parse_duration(t)
                        .map_err(|e| anyhow::anyhow!("--ttl: {e}, or 0 for no expiry"))?
                        .as_millis() as u64,
                ),
            };
            if uses == Some(0) {
                bail!("--uses 0 would admit no agent");
            }
            let mut granted = BTreeMap::new();
            for t in &tags {
                let Some((k, v)) = t.split_once('=') else { bail!("--tag {t:?}: expected key=value") };
                granted.insert(k.to_string(), v.to_string());
            }
            let identity = key.load(store_path)?;
            let text = new_token(&mut store, &identity, ttl_ms, uses, &granted)?;
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
                writeln!(out, "{}  {state}, {} used, {uses} left  {}", t.id, t.used, tags.join(","))?;
            }
            emit(&out)
        }
        TokenAction::Revoke { id } => {
            let n = store.revoke_token(&id)?;
            if n == 0 {
                bail!("no join token with an id starting {id:?} (at least 4 hex digits; see tunefleet token list)");
            }
            println!("revoked {n} join token(s); agents they admitted stay pinned (tunefleet agents forget NAME)");
            Ok(())
        }
    }
}

async fn demo(args: DemoArgs, shutdown: impl std::future::Future<Output = ()>) -> anyhow::Result<()> {
    let study = study::parse(DEMO_STUDY, "examples/studies/demo.toml")?;
    let exe = std::env::current_exe().context("locating the tunefleet executable")?;
    let bin_dir = exe.parent().context("the executable has no directory")?.to_path_buf();
    let agent_exe = bin_dir.join("tunefleet-agent");
    if !agent_exe.exists() {
        bail!("{} not found: build the whole workspace first (cargo build --release)", agent_exe.display());
    }
    for f in [args.store.clone(), args.store.with_extension("db-wal"), args.store.with_extension("db-shm")] {
        if f.exists() {
            std::fs::remove_file(&f).with_context(|| format!("removing the old demo store {}", f.display()))?;
        }
    }
    let b = broker::start(&BrokerSettings { listen: "127.0.0.1:0".parse()?, ..BrokerSettings::default() })?;
    let url = format!("mqtt://{}", b.addr);
    let path = std::env::join_paths(
        std::iter::once(bin_dir.clone()).chain(std::env::var_os("PATH").iter().flat_map(std::env::split_paths)),
    )?;
    let root = format!("tunefleet-demo-{}", std::process::id());
    // The demo's agents join as any agent does: with a join token for this
    // coordinator, admitting exactly them, for the demo's length.
    let join = {
        let identity = KeyArg { path: None }.load(&args.store)?;
        let mut store = Store::open(&args.store).with_context(|| format!("opening {}", args.store.display()))?;
        new_token(&mut store, &identity, Some(3_600_000), Some(u64::from(args.agents)), &BTreeMap::new())?
    };
    let mut agents = Vec::new();
    for i in 1..=args.agents {
        let child = tokio::process::Command::new(&agent_exe)
            .args(["--broker", &url, "--name", &format!("demo-agent-{i}"), "--root", &root])
            .args(["--tag", "pool=demo"])
            .env("TUNEFLEET_JOIN", &join)
            .env("PATH", &path)
            .env("TUNEFLEET_LOG", std::env::var("TUNEFLEET_LOG").unwrap_or_else(|_| "warn".into()))
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", agent_exe.display()))?;
        agents.push(child);
    }
    println!(
        "demo: embedded broker on {}, {} agents, study {:?} ({} trials)",
        b.addr, args.agents, study.name, study.budget
    );
    let broker_args = BrokerArgs {
        launch: crate::launch::LaunchArgs { launcher: None, launch_max: 0, launch_grace: Duration::ZERO },
        broker: Some(url.parse()?),
        listen: b.addr,
        root,
        keepalive: 5,
        broker_users: None,
        broker_cert: None,
        broker_key: None,
        broker_client_ca: None,
        security: SecurityArgs::default(),
        key: KeyArg { path: None },
        max_agents: crate::auth::DEFAULT_MAX_AGENTS,
        open_enrolment: false,
        // The demo's agents share this machine with the coordinator: their
        // trials load each other's CPUs, which is not overload.
        offload_cpu: 0.5,
        offload_memory: 0.95,
        offload_window: 3,
        offload: false,
    };
    let result = run_study(study, &broker_args, &args.influx, &args.store, !args.quiet, shutdown).await;
    for child in &mut agents {
        if let Some(pid) = child.id().and_then(|p| rustix::process::Pid::from_raw(p as i32)) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
    }
    for child in &mut agents {
        if tokio::time::timeout(Duration::from_secs(10), child.wait()).await.is_err() {
            let _ = child.kill().await;
        }
    }
    let summary = result?;
    print_summary(&summary, &args.store);
    println!(
        "look closer: tunefleet best demo --store {0} -n 3; tunefleet export demo --store {0} --format csv",
        args.store.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_command_line_definition_is_consistent() {
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
    }
}
