//! From flags to a running coordinator: the key file, the broker, the
//! offload policy and the InfluxDB sink the flags of [`super::args`] ask for,
//! gathered into a [`RunConfig`] and run ([`run_studies`]), printing the
//! lines scripts read.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tunefleet_common::security::PASSWORD_ENV;
use tunefleet_common::topic::Topics;

use super::args::{BrokerArgs, ControlArg, InfluxArgs, KeyArg};
use super::error::{CliError, Result};
use crate::domain::study::Study;
use crate::runtime::broker::{BrokerSettings, BrokerTls};
use crate::runtime::engine::Summary;
use crate::runtime::run::{BrokerChoice, RunConfig};
use crate::runtime::sink::SinkConfig;

impl KeyArg {
    /// The key file to use with the store at `store`.
    pub fn resolve(&self, store: &Path) -> PathBuf {
        self.path.clone().unwrap_or_else(|| {
            let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
            crate::runtime::auth::default_key_path(store, env("STATE_DIRECTORY"), env("XDG_STATE_HOME"), env("HOME"))
        })
    }

    /// Loads the key, creating it (and saying so) when missing.
    pub fn load(&self, store: &Path) -> Result<tunefleet_common::auth::Identity> {
        let path = self.resolve(store);
        let (identity, created) = tunefleet_common::auth::Identity::load_or_create(&path)?;
        if created {
            tracing::warn!(path = %path.display(), key = %tunefleet_common::auth::short_key(&identity.public()), "created the coordinator's key");
        }
        Ok(identity)
    }
}

impl BrokerArgs {
    /// The overload policy of these flags (`None` without --offload).
    pub fn offload(&self) -> Result<Option<crate::domain::offload::OffloadPolicy>> {
        if !self.offload {
            return Ok(None);
        }
        for (name, v) in [("--offload-cpu", self.offload_cpu), ("--offload-memory", self.offload_memory)] {
            if !(v > 0.0 && v <= 1.0) {
                return Err(CliError::refused(format!("{name} must be in (0, 1], not {v}")));
            }
        }
        if self.offload_window == 0 {
            return Err(CliError::refused("--offload-window must be at least 1 second"));
        }
        Ok(Some(crate::domain::offload::OffloadPolicy {
            cpu_ratio: self.offload_cpu,
            memory_ratio: self.offload_memory,
            window_ms: self.offload_window.saturating_mul(1000),
            ..crate::domain::offload::OffloadPolicy::default()
        }))
    }

    /// The embedded broker's settings, unless `--broker` names an external one.
    fn choice(&self) -> Result<BrokerChoice> {
        if let Some(url) = &self.broker {
            let password = std::env::var(PASSWORD_ENV).ok();
            let security = self.security.resolve(url, password)?;
            return Ok(BrokerChoice::External { url: url.clone(), security });
        }
        let lines = self
            .broker_users
            .as_deref()
            .map(crate::runtime::logins::read_user_lines)
            .transpose()
            .map_err(CliError::Refused)?;
        let users = lines.as_ref().map(|l| l.iter().map(|(u, line)| (u.clone(), line.password.clone())).collect());
        let tls = match (&self.broker_cert, &self.broker_key, &self.broker_client_ca) {
            (Some(cert), Some(key), Some(client_ca)) => {
                Some(BrokerTls { cert: cert.clone(), key: key.clone(), client_ca: client_ca.clone() })
            }
            _ => None,
        };
        if !self.listen.ip().is_loopback() && users.is_none() && tls.is_none() {
            if !self.broker_open_to_network {
                return Err(CliError::refused(format!(
                    "the embedded broker would listen on {} with neither logins nor TLS: anyone who reaches it could \
                     connect, ask to enrol and see topic names, sizes and timing. Give --broker-users and/or \
                     --broker-cert, or say --broker-open-to-network to accept that",
                    self.listen
                )));
            }
            eprintln!(
                "WARNING: the embedded broker listens on {} with no login and no TLS (--broker-open-to-network): \
                 anyone who reaches it can connect and ask to enrol (a join token still decides who gets in).",
                self.listen
            );
        }
        let settings =
            BrokerSettings { listen: self.listen, users, nodelay: true, tls, engine: self.embedded_broker, gate: None };
        Ok(BrokerChoice::Embedded(settings, lines))
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

impl ControlArg {
    /// The socket path: given, or beside `store`.
    pub fn resolve(&self, store: &Path) -> PathBuf {
        self.control.clone().unwrap_or_else(|| crate::runtime::control::default_path(store))
    }
}

/// Runs `study` through [`crate::runtime::run::run`] with the flags' settings, and
/// prints what scripts read: the broker URL first, the InfluxDB figures last.
pub async fn run_study(
    study: Study,
    args: &BrokerArgs,
    influx: &InfluxArgs,
    store_path: &Path,
    progress: bool,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<Summary> {
    let mut summaries = run_studies(vec![study], args, influx, store_path, progress, None, shutdown).await?;
    summaries.pop().ok_or_else(|| CliError::refused("the run ended without a summary"))
}

/// A service's control socket, and how long its lease runs unrenewed
/// before a standby on the same server's store takes over.
#[derive(Debug, Clone)]
pub struct Service {
    pub control: PathBuf,
    pub lease: Duration,
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
    service: Option<Service>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<Vec<Summary>> {
    for study in &studies {
        for warning in study.unused_param_warnings() {
            tracing::warn!("{warning}");
        }
    }
    let config = RunConfig {
        studies,
        broker: args.choice()?,
        topics: Topics::new(&args.root)?,
        keepalive: Duration::from_secs(args.keepalive),
        store: store_path.to_path_buf(),
        identity: args.key.resolve(store_path),
        max_agents: args.max_agents,
        max_slots: args.max_slots_per_agent,
        max_gpus: args.max_gpus_per_agent,
        store_min_free: args.store_min_free_mib.saturating_mul(1024 * 1024),
        store_share: args.store_share_mib.saturating_mul(1024 * 1024),
        open_enrolment: args.open_enrolment,
        influx: influx.config().map(|c| (c, Duration::from_secs(influx.influx_grace))),
        progress,
        offload: args.offload()?,
        // Scripts and tests read this line to find a broker on a port the OS chose.
        on_broker: Some(Box::new(|url| println!("broker: {url}"))),
        launch: Some(args.launch.clone()),
        control: service.as_ref().map(|s| s.control.clone()),
        lease: service.map(|s| s.lease),
    };
    let outcome = crate::runtime::run::run(config, shutdown).await?;
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
