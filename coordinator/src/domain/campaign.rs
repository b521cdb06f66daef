//! Campaigns: many workloads from one file (Lorien tuned a hundred
//! operators from one workloads file), each run as a study of its own over
//! the shared fleet, side by side, resumable like a study.
//!
//! ```toml
//! name = "kinds"                  # studies are named "kinds-<workload>"
//! [defaults]                      # merged into every workload's study
//! timeout = 120
//! [defaults.objective]
//! metric = "accuracy"
//! direction = "maximize"
//!
//! [[workload]]
//! name = "train-small"
//! file = "train.toml"             # a study file (relative to this one), optional
//! [workload.hyper.lr]             # any study key, over the file's and the defaults
//! kind = "categorical"
//! values = [0.05, 0.1]
//! ```
//!
//! Each workload's study is the defaults, then its `file`, then its own
//! keys, merged table by table (a later value replaces an earlier one;
//! tables merge key by key), then checked like any study file. Running the
//! campaign again with the same store resumes every study where it stopped.

use std::path::{Path, PathBuf};

use crate::domain::study::{self, Study, StudyError};

/// Why a campaign file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CampaignError {
    #[error("cannot read {path}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{origin}: {message}")]
    Invalid { origin: String, message: String },
    #[error("{origin}, workload {workload:?}")]
    Study { origin: String, workload: String, source: Box<StudyError> },
}

/// A campaign: its name and one study per workload.
#[derive(Debug)]
pub struct Campaign {
    pub name: String,
    pub studies: Vec<Study>,
}

/// `over` merged into `base`: tables key by key, anything else replaced.
fn merge(base: &mut toml::Table, over: toml::Table) {
    for (k, v) in over {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

/// Reads and checks the campaign file at `path`.
pub fn load(path: &Path) -> Result<Campaign, CampaignError> {
    let text = std::fs::read_to_string(path).map_err(|source| CampaignError::Read { path: path.into(), source })?;
    parse(&text, &path.display().to_string(), path.parent().unwrap_or(Path::new(".")))
}

/// Parses campaign text; `dir` is where workload `file`s are found.
pub fn parse(text: &str, origin: &str, dir: &Path) -> Result<Campaign, CampaignError> {
    let invalid = |message: String| CampaignError::Invalid { origin: origin.to_string(), message };
    let mut table: toml::Table = text.parse().map_err(|e: toml::de::Error| invalid(e.to_string()))?;
    let name = match table.remove("name") {
        Some(toml::Value::String(n)) if !n.is_empty() => n,
        _ => return Err(invalid("name: a campaign needs a name (a string)".into())),
    };
    let defaults = match table.remove("defaults") {
        None => toml::Table::new(),
        Some(toml::Value::Table(t)) => t,
        Some(_) => return Err(invalid("defaults: must be a table".into())),
    };
    let workloads = match table.remove("workload") {
        Some(toml::Value::Array(a)) if !a.is_empty() => a,
        _ => return Err(invalid("workload: list at least one [[workload]]".into())),
    };
    if let Some(key) = table.keys().next() {
        return Err(invalid(format!("unknown key {key:?} (a campaign has name, [defaults] and [[workload]])")));
    }
    let mut seen = std::collections::HashSet::new();
    for w in &workloads {
        if let Some(toml::Value::String(n)) = w.get("name") {
            if !seen.insert(n.clone()) {
                return Err(invalid(format!("workload {n:?} is listed twice")));
            }
        }
    }
    let mut studies = Vec::new();
    for (i, w) in workloads.into_iter().enumerate() {
        let toml::Value::Table(mut w) = w else {
            return Err(invalid(format!("workload {}: must be a table", i + 1)));
        };
        let wname = match w.remove("name") {
            Some(toml::Value::String(n)) if !n.is_empty() => n,
            _ => return Err(invalid(format!("workload {}: needs a name (a string)", i + 1))),
        };
        let mut merged = defaults.clone();
        if let Some(file) = w.remove("file") {
            let toml::Value::String(file) = file else {
                return Err(invalid(format!("workload {wname:?}: file must be a path")));
            };
            let path = dir.join(&file);
            let text =
                std::fs::read_to_string(&path).map_err(|source| CampaignError::Read { path: path.clone(), source })?;
            let t: toml::Table =
                text.parse().map_err(|e: toml::de::Error| invalid(format!("{}: {e}", path.display())))?;
            merge(&mut merged, t);
        }
        merge(&mut merged, w);
        merged.insert("name".into(), toml::Value::String(format!("{name}-{wname}")));
        let study_text = toml::to_string(&merged).map_err(|e| invalid(format!("workload {wname:?}: {e}")))?;
        let study = study::parse(&study_text, &format!("{origin} [workload {wname}]")).map_err(|e| {
            CampaignError::Study { origin: origin.to_string(), workload: wname.clone(), source: Box::new(e) }
        })?;
        studies.push(study);
    }
    Ok(Campaign { name, studies })
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#"
command = ["tunefleet-train", "--lr", "{lr}"]
timeout = 60
[objective]
metric = "accuracy"
direction = "maximize"
[budget]
trials = 2
[strategy]
kind = "grid"
[hyper.lr]
kind = "categorical"
values = [0.1, 0.2]
"#;

    #[test]
    fn workloads_merge_defaults_file_and_their_own_keys() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("base.toml"), BASE).expect("write");
        let text = r#"
name = "c"
[defaults]
timeout = 30
[defaults.budget]
trials = 5

[[workload]]
name = "a"
file = "base.toml"

[[workload]]
name = "b"
file = "base.toml"
timeout = 90
[workload.hyper.lr]
kind = "categorical"
values = [0.3]
"#;
        let c = parse(text, "c.toml", dir.path()).expect("parses");
        assert_eq!(c.name, "c");
        let names: Vec<&str> = c.studies.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, vec!["c-a", "c-b"]);
        // The file overrides the defaults; the workload overrides the file.
        assert_eq!(c.studies[0].timeout_s, 60);
        assert_eq!(c.studies[0].budget, 2, "the file's budget table replaced the defaults' key by key");
        assert_eq!(c.studies[1].timeout_s, 90);
        let lr = format!("{:?}", c.studies[1].hyper.get("lr"));
        assert!(lr.contains("0.3") && !lr.contains("0.1"), "{lr}");
    }

    #[test]
    fn the_bundled_campaign_is_valid() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/campaigns/kinds.toml");
        let c = load(&path).expect("examples/campaigns/kinds.toml");
        let names: Vec<&str> = c.studies.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, vec!["kinds-train", "kinds-stream", "kinds-io"]);
        assert!(c.studies.iter().all(|s| s.pipeline.is_some() && !s.reuse.enabled));
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/campaigns/kinds6.toml");
        let c = load(&path).expect("examples/campaigns/kinds6.toml");
        assert_eq!(c.studies.len(), 6);
        assert!(c.studies.iter().all(|s| s.pipeline.is_some() && !s.reuse.enabled && s.budget == 8));
        let identities: std::collections::BTreeSet<String> = c.studies.iter().map(|s| s.workload()).collect();
        assert_eq!(identities.len(), 6, "six workloads: {identities:?}");
    }

    #[test]
    fn bad_campaigns_say_what_is_wrong() {
        let dir = tempfile::tempdir().expect("tempdir");
        let err = |text: &str| parse(text, "c.toml", dir.path()).expect_err("refused").to_string();
        assert!(err("[[workload]]\nname = \"a\"").contains("needs a name"));
        assert!(err("name = \"c\"").contains("at least one"));
        assert!(err("name = \"c\"\nother = 1\n[[workload]]\nname = \"a\"").contains("unknown key \"other\""));
        assert!(err("name = \"c\"\n[[workload]]\nname = \"a\"\n[[workload]]\nname = \"a\"").contains("twice"));
        assert!(err("name = \"c\"\n[[workload]]\nname = \"a\"\nfile = \"missing.toml\"").contains("cannot read"));
        let e = err("name = \"c\"\n[[workload]]\nname = \"a\"\ncommand = [\"x\"]");
        assert!(e.contains("workload \"a\""), "{e}");
    }
}
