//! The `tunefleet` command line: flags parsed by clap (`args`), then one
//! function per subcommand in the module of its group. Every subcommand
//! that reads results takes `--store PATH`.
//!
//! * `args`: the clap definitions, nothing else;
//! * `wiring`: flags to a [`crate::RunConfig`], and the run;
//! * `run`: `run`, `campaign`, `serve`, `submit`, `cancel`, `check`;
//! * `fleet`: `token`, `agents`, `key`;
//! * `results`: `status`, `studies`, `best`, `profiles`, `report`,
//!   `export`, rendered by `view`;
//! * `demo`: the demo's supervisor; `docs`: completions and man pages;
//! * `error`: [`CliError`], what `main` prints and maps to an exit code.

mod api;
mod args;
pub mod config;
mod demo;
mod docs;
mod error;
mod fleet;
mod http;
pub mod manual;
mod metrics;
mod output;
mod page;
mod results;
mod run;
mod store;
mod view;
mod wiring;

pub use args::{
    AgentsAction, BrokerArgs, Cli, Command, ControlArg, DemoArgs, Format, InfluxArgs, KeyArg, ProfilesAction, RunArgs,
    ServeArgs, StoreAction, StoreArg, TokenAction,
};
pub use demo::DEMO_STUDY;
pub use docs::Program;
pub use error::CliError;
pub use fleet::new_token;
pub use wiring::{run_studies, run_study};

/// Runs one subcommand.
pub async fn execute(cli: Cli, shutdown: impl std::future::Future<Output = ()>) -> Result<(), CliError> {
    match cli.command {
        Command::Run(args) => run::run(&args, shutdown).await,
        Command::Campaign(args) => run::campaign(&args, shutdown).await,
        Command::Serve(args) => run::serve(&args, shutdown).await,
        Command::Submit { study, control, store } => run::submit(&study, &control, &store).await,
        Command::Cancel { study, control, store } => run::cancel(study, &control, &store).await,
        Command::Enqueue { study, params, control, store } => run::enqueue(study, &params, &control, &store).await,
        Command::Check { study } => run::check(&study),
        Command::Demo(args) => demo::demo(args, shutdown).await,
        Command::Key { key } => fleet::key(&key),
        Command::Token { action, store } => fleet::token(action, &store.store),
        Command::Agents { action: Some(action), store, .. } => fleet::change(action, &store.store),
        Command::Agents { action: None, json, watch, store } => fleet::list(&store.store, json, watch, shutdown).await,
        Command::Status { study, watch, json, store } => {
            results::status(&store.store, study.as_deref(), watch, json, shutdown).await
        }
        Command::Studies { action, json, store } => results::studies(&store.store, action, json),
        Command::Store { action: StoreAction::Copy { from, to, json } } => store::copy(&from, &to, json),
        Command::Best { study, n, pareto, by_class, json, store } => {
            let ask = match (pareto, by_class) {
                (true, _) => crate::query::best::BestAsk::Pareto,
                (false, true) => crate::query::best::BestAsk::ByClass,
                (false, false) => crate::query::best::BestAsk::Best,
            };
            results::best(&store.store, &study, n, ask, json)
        }
        Command::Profiles { action, json, store } => results::profiles(&store.store, action, json),
        Command::Report { study, output, n, store } => results::report(&store.store, &study, &output, n),
        Command::Export { study, format, output, store } => results::export(&store.store, &study, format, output),
        Command::Completions { shell, agent } => docs::completions(shell, agent),
        Command::Man { output, agent } => docs::man(output, agent),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_command_line_definition_is_consistent() {
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
    }
}
