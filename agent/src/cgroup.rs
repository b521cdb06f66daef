//! Trial limits through cgroup v2: `memory.max`, and `cpuset.cpus` and
//! `cpu.max` where those controllers are usable too.
//!
//! Where trial cgroups live ([`CgroupV2::detect`]; the root, default
//! `/sys/fs/cgroup`, and the file naming the agent's own cgroup are
//! parameters so tests use fixture trees):
//!
//! * **Delegated**: under systemd with `Delegate=yes` the unit's cgroup (the
//!   `0::/path` line of `/proc/self/cgroup`) is handed to the agent. cgroup v2
//!   allows no process in a cgroup whose controllers are enabled for its
//!   children ("no internal processes"), so the agent first moves every
//!   process of that cgroup (itself) into a leaf, [`AGENT_LEAF`], then
//!   enables the controllers, and creates trial cgroups as siblings of the
//!   leaf. A cgroup counts as delegated when systemd marked it so (the
//!   `trusted.delegate` / `user.delegate` extended attributes, systemd ≥ 251)
//!   or, for a non-root agent, when the agent's user owns it: a root agent
//!   started from a shell or a unit without `Delegate=` must not rearrange a
//!   cgroup that systemd manages.
//! * **Shared**: otherwise `{root}/tunefleet` (needs root), as before.
//!
//! The memory controller is required (the runner asks for a cgroup only for
//! a memory limit); `cpuset` and `cpu` are used when offered, and
//! [`TrialCgroup::controllers`] says which a trial has. Without a usable
//! memory controller (cgroup v1 or hybrid hierarchies, no permission)
//! [`CgroupV2::detect`] returns `None` and the runner falls back to
//! `RLIMIT_AS`. The writers also serve live changes between the windows of a
//! running trial (see [`crate::live`] for the per-thread side).

use std::fmt;
use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

/// Default mount point of the cgroup v2 hierarchy.
pub use tunefleet_common::agent_cli::CGROUP_ROOT as DEFAULT_ROOT;
/// Name of the agent's parent cgroup under the root, when nothing is delegated.
pub const PARENT: &str = "tunefleet";
/// The leaf of a delegated cgroup that holds the agent's own processes.
pub const AGENT_LEAF: &str = "agent";
/// Where a process reads its own cgroups.
pub const SELF_CGROUP: &str = "/proc/self/cgroup";

/// A cgroup operation that failed.
#[derive(Debug, thiserror::Error)]
#[error("cgroup {action} {path}: {source}")]
pub struct CgroupError {
    pub action: &'static str,
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
}

impl CgroupError {
    /// For `map_err`: the error of `action` on `path`.
    fn new(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> CgroupError {
        let path = path.to_path_buf();
        move |source| CgroupError { action, path, source }
    }
}

/// The controllers Tunefleet uses, as a set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Controllers {
    pub memory: bool,
    pub cpuset: bool,
    pub cpu: bool,
}

impl Controllers {
    /// Every controller Tunefleet uses.
    pub const ALL: Controllers = Controllers { memory: true, cpuset: true, cpu: true };

    /// Parses `cgroup.controllers` or `cgroup.subtree_control` (a `+` before
    /// a name, as written, is accepted; unknown names are ignored).
    pub fn parse(text: &str) -> Self {
        let mut c = Controllers::default();
        for name in text.split_whitespace().map(|n| n.trim_start_matches('+')) {
            match name {
                "memory" => c.memory = true,
                "cpuset" => c.cpuset = true,
                "cpu" => c.cpu = true,
                _ => {}
            }
        }
        c
    }

    /// The controllers a file lists; none when it cannot be read.
    pub fn read(path: &Path) -> Self {
        fs::read_to_string(path).map(|t| Self::parse(&t)).unwrap_or_default()
    }

    /// Names in the order they are enabled: memory first, it is required.
    pub fn names(self) -> Vec<&'static str> {
        [(self.memory, "memory"), (self.cpuset, "cpuset"), (self.cpu, "cpu")]
            .into_iter()
            .filter_map(|(on, name)| on.then_some(name))
            .collect()
    }

    pub fn is_empty(self) -> bool {
        self == Controllers::default()
    }

    fn and(self, other: Controllers) -> Self {
        Controllers {
            memory: self.memory && other.memory,
            cpuset: self.cpuset && other.cpuset,
            cpu: self.cpu && other.cpu,
        }
    }

    fn without(self, other: Controllers) -> Self {
        Controllers {
            memory: self.memory && !other.memory,
            cpuset: self.cpuset && !other.cpuset,
            cpu: self.cpu && !other.cpu,
        }
    }
}

impl fmt::Display for Controllers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.names().join(" ") {
            names if names.is_empty() => f.write_str("none"),
            names => f.write_str(&names),
        }
    }
}

/// The agent's own cgroup v2 path, relative to the hierarchy's root, from
/// the contents of `/proc/self/cgroup` (its `0::/path` line). `None` at the
/// root itself, for a removed cgroup, or without a cgroup v2 line.
pub fn parse_own_cgroup(self_cgroup: &str) -> Option<PathBuf> {
    let path = self_cgroup.lines().find_map(|l| l.strip_prefix("0::"))?.trim_end();
    let relative = Path::new(path.strip_prefix('/')?);
    let plain = relative.components().all(|c| matches!(c, Component::Normal(_)));
    (plain && !path.ends_with(" (deleted)") && relative.components().next().is_some()).then(|| relative.to_path_buf())
}

/// Whether cgroup `dir` was delegated to this process: marked so by systemd
/// (`trusted.delegate` or `user.delegate` set to `1`, systemd ≥ 251), or,
/// for a non-root process, owned by its user (root owns every cgroup, so
/// ownership says nothing for root).
pub fn is_delegated(dir: &Path) -> bool {
    let marked = |name: &str| {
        let mut value = [0u8; 8];
        matches!(rustix::fs::getxattr(dir, name, &mut value[..]), Ok(n) if value.get(..n) == Some(&b"1"[..]))
    };
    if marked("trusted.delegate") || marked("user.delegate") {
        return true;
    }
    let euid = rustix::process::geteuid();
    !euid.is_root() && fs::metadata(dir).is_ok_and(|m| m.uid() == euid.as_raw())
}

/// Fails unless `dir` is a cgroup v2 directory (it has `cgroup.controllers`).
fn require_v2(dir: &Path) -> Result<(), CgroupError> {
    let controllers = dir.join("cgroup.controllers");
    fs::metadata(&controllers).map(drop).map_err(CgroupError::new("read", &controllers))
}

/// Enables for the children of `dir` those of `wanted` that `dir` offers,
/// and returns the ones its children have. All at once first; if that fails
/// (one controller can refuse, e.g. `cpu` with realtime processes in a
/// non-root cgroup) one by one, so the others still count. An error only
/// when nothing could be enabled.
fn enable_for_children(dir: &Path, wanted: Controllers) -> Result<Controllers, CgroupError> {
    let control = dir.join("cgroup.subtree_control");
    let offered = Controllers::read(&dir.join("cgroup.controllers")).and(wanted);
    let missing = offered.without(Controllers::read(&control));
    let line = |names: &[&str]| names.iter().map(|n| format!("+{n}")).collect::<Vec<_>>().join(" ");
    if !missing.is_empty() && fs::write(&control, line(&missing.names())).is_err() {
        let mut first_error = None;
        let mut enabled_any = false;
        for name in missing.names() {
            match fs::write(&control, line(&[name])) {
                Ok(()) => enabled_any = true,
                Err(e) => {
                    tracing::debug!(path = %control.display(), controller = name, error = %e, "cannot enable a cgroup controller");
                    first_error.get_or_insert(e);
                }
            }
        }
        if let (false, Some(e)) = (enabled_any, first_error) {
            return Err(CgroupError::new("enable controllers in", &control)(e));
        }
    }
    Ok(Controllers::read(&control).and(wanted))
}

/// Moves every process listed in `from/cgroup.procs` into `to`; processes
/// that exit meanwhile are skipped.
fn move_processes(from: &Path, to: &Path) -> Result<(), CgroupError> {
    let procs = from.join("cgroup.procs");
    let text = fs::read_to_string(&procs).map_err(CgroupError::new("read", &procs))?;
    let target = to.join("cgroup.procs");
    for pid in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        match fs::write(&target, pid) {
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::SRCH.raw_os_error()) => {}
            other => other.map_err(CgroupError::new("write", &target))?,
        }
    }
    Ok(())
}

/// A cgroup v2 hierarchy where the agent can create trial cgroups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupV2 {
    parent: PathBuf,
    controllers: Controllers,
    delegated: bool,
}

impl CgroupV2 {
    /// The agent's cgroups under `root`: its own delegated cgroup when there
    /// is one, else `{root}/tunefleet`; `None` when the memory controller is
    /// not usable (logged). Call it once, at start: a delegated cgroup's
    /// processes, the agent's, are moved into [`AGENT_LEAF`].
    pub fn detect(root: &Path) -> Option<Self> {
        Self::detect_from(root, Path::new(SELF_CGROUP))
    }

    /// [`CgroupV2::detect`] with the agent's own cgroup read from `self_cgroup`
    /// (the format of `/proc/self/cgroup`).
    pub fn detect_from(root: &Path, self_cgroup: &Path) -> Option<Self> {
        let own = fs::read_to_string(self_cgroup).ok().as_deref().and_then(parse_own_cgroup);
        if let Some(own) = own.filter(|own| is_delegated(&root.join(own))) {
            let dir = root.join(&own);
            if !Controllers::read(&dir.join("cgroup.controllers")).memory {
                tracing::info!(cgroup = %dir.display(), "the delegated cgroup has no memory controller; not using it");
            } else {
                match Self::delegated(root, &own) {
                    Ok(c) if c.controllers.memory => {
                        tracing::info!(parent = %c.parent.display(), controllers = %c.controllers, "trial cgroups in the agent's delegated cgroup");
                        return Some(c);
                    }
                    Ok(c) => {
                        tracing::info!(cgroup = %dir.display(), controllers = %c.controllers, "memory controller not enabled in the delegated cgroup")
                    }
                    Err(e) => tracing::warn!(error = %e, "the delegated cgroup is not usable"),
                }
            }
        }
        if !Controllers::read(&root.join("cgroup.controllers")).memory {
            tracing::debug!(root = %root.display(), "no cgroup v2 memory controller");
            return None;
        }
        match Self::shared(root, PARENT) {
            Ok(c) if c.controllers.memory => {
                tracing::info!(parent = %c.parent.display(), controllers = %c.controllers, "trial cgroups");
                Some(c)
            }
            Ok(c) => {
                tracing::debug!(parent = %c.parent.display(), controllers = %c.controllers, "cgroup v2 memory controller not enabled");
                None
            }
            Err(e) => {
                tracing::debug!(error = %e, "cgroup v2 memory controller not usable");
                None
            }
        }
    }

    /// Trial cgroups in the delegated cgroup `own` (relative to `root`):
    /// moves its processes into `own/agent`, then enables the controllers
    /// it offers for its children. Does not check that `own` is delegated,
    /// nor require any controller.
    pub fn delegated(root: &Path, own: &Path) -> Result<Self, CgroupError> {
        let parent = root.join(own);
        require_v2(&parent)?;
        let leaf = parent.join(AGENT_LEAF);
        fs::create_dir_all(&leaf).map_err(CgroupError::new("create", &leaf))?;
        move_processes(&parent, &leaf)?;
        let controllers = enable_for_children(&parent, Controllers::ALL)?;
        Ok(CgroupV2 { parent, controllers, delegated: true })
    }

    /// Trial cgroups in `{root}/{name}`, with the controllers `root` offers
    /// enabled on the way. Requires no controller.
    pub fn shared(root: &Path, name: &str) -> Result<Self, CgroupError> {
        require_v2(root)?;
        enable_for_children(root, Controllers::ALL)?;
        let parent = root.join(name);
        fs::create_dir_all(&parent).map_err(CgroupError::new("create", &parent))?;
        let controllers = enable_for_children(&parent, Controllers::ALL)?;
        Ok(CgroupV2 { parent, controllers, delegated: false })
    }

    /// The cgroup whose children trial cgroups are.
    pub fn parent(&self) -> &Path {
        &self.parent
    }

    /// The controllers every trial cgroup has.
    pub fn controllers(&self) -> Controllers {
        self.controllers
    }

    /// Whether the parent is the agent's delegated cgroup.
    pub fn is_delegated(&self) -> bool {
        self.delegated
    }

    /// Creates the cgroup of one trial, with no limit yet. `name` is one
    /// path component, not [`AGENT_LEAF`].
    pub fn create(&self, name: &str) -> Result<TrialCgroup, CgroupError> {
        let dir = self.parent.join(name);
        let single = Path::new(name).components().eq([Component::Normal(name.as_ref())]);
        if !single || name == AGENT_LEAF {
            let why = io::Error::new(io::ErrorKind::InvalidInput, "not a trial cgroup name");
            return Err(CgroupError { action: "create", path: dir, source: why });
        }
        fs::create_dir_all(&dir).map_err(CgroupError::new("create", &dir))?;
        if self.controllers.memory {
            // The trial's tree is killed on limit, not just the biggest process.
            let _ = fs::write(dir.join("memory.oom.group"), "1");
        }
        Ok(TrialCgroup { dir, controllers: self.controllers })
    }

    /// Creates the cgroup of one trial with `memory.max = bytes`.
    pub fn create_trial(&self, name: &str, bytes: u64) -> Result<TrialCgroup, CgroupError> {
        let trial = self.create(name)?;
        match trial.set_memory_max(Some(bytes)) {
            Ok(()) => Ok(trial),
            Err(e) => {
                trial.remove();
                Err(e)
            }
        }
    }
}

/// The cgroup of one trial; removed with [`TrialCgroup::remove`].
#[derive(Debug)]
pub struct TrialCgroup {
    dir: PathBuf,
    controllers: Controllers,
}

impl TrialCgroup {
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The controllers this cgroup has (its parent enabled for it).
    pub fn controllers(&self) -> Controllers {
        self.controllers
    }

    /// Moves process `pid` into this cgroup.
    pub fn add(&self, pid: u32) -> Result<(), CgroupError> {
        let procs = self.dir.join("cgroup.procs");
        fs::write(&procs, pid.to_string()).map_err(CgroupError::new("write", &procs))
    }

    /// Writes `value` to the interface file `file` of `controller`.
    fn set(&self, controller: &'static str, present: bool, file: &str, value: &str) -> Result<(), CgroupError> {
        let path = self.dir.join(file);
        if !present {
            let why = io::Error::new(io::ErrorKind::Unsupported, format!("no {controller} controller in this cgroup"));
            return Err(CgroupError { action: "write", path, source: why });
        }
        fs::write(&path, value).map_err(CgroupError::new("write", &path))
    }

    /// Sets `memory.max` (none: `max`). Lowering it below the trial's usage
    /// makes the kernel reclaim, and kill the trial (`memory.oom.group`)
    /// when it cannot.
    pub fn set_memory_max(&self, bytes: Option<u64>) -> Result<(), CgroupError> {
        let value = bytes.map_or_else(|| "max".to_string(), |b| b.to_string());
        self.set("memory", self.controllers.memory, "memory.max", &value)
    }

    /// Sets `cpuset.cpus` (empty: the parent's CPUs). The kernel moves the
    /// trial's threads at once; their affinity masks become the new set
    /// (intersected, since Linux 6.2, with a mask they asked for, so set the
    /// cpuset before [`crate::live::set_affinity`]).
    pub fn set_cpus(&self, cpus: &[u32]) -> Result<(), CgroupError> {
        // A newline, not "": an empty write never reaches the kernel.
        let value = format!("{}\n", crate::live::format_cpu_list(cpus));
        self.set("cpuset", self.controllers.cpuset, "cpuset.cpus", &value)
    }

    /// Sets `cpu.max` to `quota_us` per `period_us` (none: no quota). The
    /// kernel wants a period of 1 ms to 1 s and a quota of at least 1 ms.
    pub fn set_cpu_max(&self, max: Option<(u64, u64)>) -> Result<(), CgroupError> {
        let value = max.map_or_else(|| "max".to_string(), |(quota, period)| format!("{quota} {period}"));
        self.set("cpu", self.controllers.cpu, "cpu.max", &value)
    }

    /// The cgroup's `memory.peak` in bytes, when the kernel provides it.
    pub fn memory_peak(&self) -> Option<u64> {
        fs::read_to_string(self.dir.join("memory.peak")).ok()?.trim().parse().ok()
    }

    /// Removes the cgroup (it must be empty); failure is logged.
    pub fn remove(self) {
        if let Err(e) = fs::remove_dir(&self.dir) {
            tracing::debug!(path = %self.dir.display(), error = %e, "cannot remove trial cgroup");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Child, Command};
    use std::time::{Duration, Instant};

    fn write(path: &Path, text: &str) {
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir).expect("mkdir");
        }
        fs::write(path, text).expect("write");
    }

    fn read(path: &Path) -> String {
        fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
    }

    /// A `/proc/self/cgroup` fixture naming `path` as the agent's cgroup.
    fn self_cgroup(dir: &Path, path: &str) -> PathBuf {
        let file = dir.join("self-cgroup");
        write(&file, &format!("1:name=systemd:/elsewhere\n0::{path}\n"));
        file
    }

    #[test]
    fn detects_and_creates_in_a_fixture_tree() {
        let root = tempfile::tempdir().expect("tempdir");
        let me = self_cgroup(root.path(), "/");
        assert_eq!(CgroupV2::detect_from(root.path(), &me), None, "no cgroup.controllers");
        write(&root.path().join("cgroup.controllers"), "cpu io\n");
        assert_eq!(CgroupV2::detect_from(root.path(), &me), None, "no memory controller");
        assert!(!root.path().join(PARENT).exists(), "nothing created without a memory controller");
        write(&root.path().join("cgroup.controllers"), "cpu memory io\n");
        write(&root.path().join(PARENT).join("cgroup.controllers"), "memory\n");
        let cg = CgroupV2::detect_from(root.path(), &me).expect("usable");
        assert_eq!(read(&root.path().join("cgroup.subtree_control")), "+memory +cpu");
        assert_eq!(cg.controllers(), Controllers { memory: true, ..Default::default() });
        assert!(!cg.is_delegated());
        let trial = cg.create_trial("s-1-0", 64 << 20).expect("create");
        trial.add(4242).expect("add");
        assert_eq!(read(&trial.path().join("memory.max")), "67108864");
        assert_eq!(read(&trial.path().join("memory.oom.group")), "1");
        assert_eq!(read(&trial.path().join("cgroup.procs")), "4242");
        assert_eq!(trial.memory_peak(), None);
    }

    #[test]
    fn parses_controllers_and_the_own_cgroup() {
        assert_eq!(Controllers::parse("cpuset cpu io memory pids\n"), Controllers::ALL);
        let two = Controllers::parse("+memory +cpu");
        assert_eq!(two, Controllers { memory: true, cpuset: false, cpu: true });
        assert_eq!(two.to_string(), "memory cpu");
        assert_eq!(Controllers::parse("io pids").to_string(), "none");

        let unit = "0::/system.slice/tunefleet-agent.service\n";
        assert_eq!(parse_own_cgroup(unit), Some(PathBuf::from("system.slice/tunefleet-agent.service")));
        assert_eq!(parse_own_cgroup("4:memory:/x\n0::/a\n"), Some(PathBuf::from("a")));
        assert_eq!(parse_own_cgroup("0::/\n"), None, "the root is nobody's delegated cgroup");
        assert_eq!(parse_own_cgroup("4:memory:/x\n"), None, "cgroup v1 only");
        assert_eq!(parse_own_cgroup("0::/a/../b\n"), None);
        assert_eq!(parse_own_cgroup("0::/a (deleted)\n"), None);
    }

    /// A fixture of systemd's layout: the unit's cgroup offers every
    /// controller and holds the agent, pid 4242.
    fn unit_fixture(root: &Path) -> PathBuf {
        write(&root.join("cgroup.controllers"), "cpuset cpu io memory pids\n");
        let own = root.join("system.slice/tunefleet-agent.service");
        write(&own.join("cgroup.controllers"), "cpuset cpu io memory pids\n");
        write(&own.join("cgroup.procs"), "4242\n");
        own
    }

    #[test]
    fn a_delegated_cgroup_gets_a_leaf_for_the_agent_and_trials_beside_it() {
        let root = tempfile::tempdir().expect("tempdir");
        let own = unit_fixture(root.path());
        let cg = CgroupV2::delegated(root.path(), Path::new("system.slice/tunefleet-agent.service")).expect("usable");
        assert_eq!((cg.parent(), cg.is_delegated(), cg.controllers()), (own.as_path(), true, Controllers::ALL));
        assert_eq!(read(&own.join(AGENT_LEAF).join("cgroup.procs")), "4242", "the agent moved to its leaf");
        assert_eq!(read(&own.join("cgroup.subtree_control")), "+memory +cpuset +cpu");
        let trial = cg.create_trial("s-1-0", 1 << 20).expect("create");
        assert_eq!(trial.path().parent(), Some(own.as_path()));
        assert!(cg.create(AGENT_LEAF).is_err(), "a trial cannot take the agent's leaf");
        assert!(cg.create("../x").is_err());
        assert!(!root.path().join(PARENT).exists());
    }

    #[test]
    fn detection_takes_the_marked_delegated_cgroup_else_falls_back() {
        let root = tempfile::tempdir().expect("tempdir");
        let own = unit_fixture(root.path());
        let me = self_cgroup(root.path(), "/system.slice/tunefleet-agent.service");
        write(&root.path().join(PARENT).join("cgroup.controllers"), "memory cpu\n");
        // What systemd ≥ 251 sets on a cgroup it delegates.
        if let Err(e) = rustix::fs::setxattr(&own, "user.delegate", b"1", rustix::fs::XattrFlags::empty()) {
            eprintln!("skipped the delegated half: the temporary file system has no user xattrs ({e})");
        } else {
            assert!(is_delegated(&own));
            let cg = CgroupV2::detect_from(root.path(), &me).expect("usable");
            assert_eq!((cg.parent(), cg.is_delegated()), (own.as_path(), true));
        }
        let plain = root.path().join("plain");
        fs::create_dir(&plain).expect("mkdir");
        assert_eq!(is_delegated(&plain), !rustix::process::geteuid().is_root(), "a non-root user's own cgroup");
        // Without a memory controller there, the shared parent serves.
        write(&own.join("cgroup.controllers"), "cpu cpuset\n");
        let cg = CgroupV2::detect_from(root.path(), &me).expect("usable");
        assert_eq!(cg.parent(), root.path().join(PARENT));
        assert_eq!(cg.controllers(), Controllers { memory: true, cpuset: false, cpu: true });
    }

    #[test]
    fn writers_write_the_kernel_formats_and_refuse_missing_controllers() {
        let root = tempfile::tempdir().expect("tempdir");
        unit_fixture(root.path());
        let cg = CgroupV2::delegated(root.path(), Path::new("system.slice/tunefleet-agent.service")).expect("usable");
        let trial = cg.create("t").expect("create");
        let file = |name: &str| read(&trial.path().join(name));
        trial.set_memory_max(Some(256 << 20)).expect("memory.max");
        assert_eq!(file("memory.max"), "268435456");
        trial.set_memory_max(None).expect("memory.max");
        assert_eq!(file("memory.max"), "max");
        trial.set_cpus(&[3, 0, 1]).expect("cpuset.cpus");
        assert_eq!(file("cpuset.cpus"), "0-1,3\n");
        trial.set_cpus(&[]).expect("cpuset.cpus");
        assert_eq!(file("cpuset.cpus"), "\n");
        trial.set_cpu_max(Some((50_000, 100_000))).expect("cpu.max");
        assert_eq!(file("cpu.max"), "50000 100000");
        trial.set_cpu_max(None).expect("cpu.max");
        assert_eq!(file("cpu.max"), "max");

        let only_memory = root.path().join("only-memory");
        write(&only_memory.join("cgroup.controllers"), "memory io\n");
        write(&only_memory.join("cgroup.procs"), "");
        let cg = CgroupV2::delegated(root.path(), Path::new("only-memory")).expect("usable");
        let trial = cg.create("t").expect("create");
        for refused in [trial.set_cpus(&[0]), trial.set_cpu_max(Some((1000, 1000)))] {
            let e = refused.expect_err("no such controller");
            assert_eq!(e.source.kind(), io::ErrorKind::Unsupported, "{e}");
        }
        assert!(!trial.path().join("cpuset.cpus").exists());
    }

    /// The cgroup v2 mount, from `/proc/self/mounts` (`/sys/fs/cgroup`, or
    /// `/sys/fs/cgroup/unified` in a hybrid layout).
    fn cgroup2_mount() -> Option<PathBuf> {
        let mounts = fs::read_to_string("/proc/self/mounts").ok()?;
        mounts.lines().find_map(|l| {
            let fields: Vec<&str> = l.split_whitespace().collect();
            (fields.get(2) == Some(&"cgroup2")).then(|| PathBuf::from(fields.get(1).copied().unwrap_or_default()))
        })
    }

    /// Where a real test may create cgroups, or why it may not.
    fn real_root() -> Result<PathBuf, String> {
        if !rustix::process::geteuid().is_root() {
            return Err("not root".into());
        }
        cgroup2_mount().ok_or_else(|| "no cgroup2 mount".into())
    }

    /// Kills the test's processes, then removes its cgroups, deepest first,
    /// even when the test fails.
    #[derive(Default)]
    struct Cleanup {
        children: Vec<Child>,
        dirs: Vec<PathBuf>,
    }

    impl Cleanup {
        fn sleeper(&mut self) -> u32 {
            let child = Command::new("sleep").arg("60").spawn().expect("spawn sleep");
            let pid = child.id();
            self.children.push(child);
            pid
        }
    }

    impl Drop for Cleanup {
        fn drop(&mut self) {
            for child in &mut self.children {
                let _ = child.kill();
                let _ = child.wait();
            }
            for dir in self.dirs.iter().rev() {
                // A reaped process can leave its cgroup a moment later.
                let deadline = Instant::now() + Duration::from_secs(5);
                while dir.exists() && fs::remove_dir(dir).is_err() && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
    }

    fn test_name(what: &str) -> String {
        format!("tunefleet-test-{what}-{}-{:x}", std::process::id(), rand::random::<u32>())
    }

    fn cgroup_of(pid: u32) -> String {
        parse_own_cgroup(&read(&PathBuf::from(format!("/proc/{pid}/cgroup"))))
            .map(|p| p.display().to_string())
            .unwrap_or_default()
    }

    fn cpus_allowed(pid: u32) -> String {
        let status = read(&PathBuf::from(format!("/proc/{pid}/status")));
        let line = status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:"));
        line.map(|v| v.trim().to_string()).unwrap_or_default()
    }

    #[test]
    fn a_real_trial_cgroup_takes_a_process_and_live_limits() {
        let root = match real_root() {
            Ok(root) => root,
            Err(why) => return eprintln!("skipped: {why}"),
        };
        let offered = Controllers::read(&root.join("cgroup.controllers"));
        let mut cleanup = Cleanup::default();
        let name = test_name("trial");
        cleanup.dirs.push(root.join(&name));
        let cg = CgroupV2::shared(&root, &name).expect("test parent");
        let trial = cg.create("trial").expect("trial cgroup");
        cleanup.dirs.push(trial.path().to_path_buf());
        let rel = trial.path().strip_prefix(&root).expect("under the root").display().to_string();
        let pid = cleanup.sleeper();
        trial.add(pid).expect("move sleep");
        assert_eq!(read(&trial.path().join("cgroup.procs")).trim(), pid.to_string());
        assert_eq!(cgroup_of(pid), rel, "the kernel sees the process in the trial cgroup");
        eprintln!("{} offers {offered}; the trial cgroup has {}", root.display(), trial.controllers());

        let file = |name: &str| read(&trial.path().join(name)).trim().to_string();
        if trial.controllers().memory {
            trial.set_memory_max(Some(64 << 20)).expect("memory.max");
            assert_eq!(file("memory.max"), "67108864");
            trial.set_memory_max(None).expect("memory.max");
            assert_eq!(file("memory.max"), "max");
        } else {
            eprintln!("memory controller not usable here: memory.max not tested for real");
            assert!(trial.set_memory_max(Some(1 << 30)).is_err());
        }
        if trial.controllers().cpuset {
            let parent = read(&cg.parent().join("cpuset.cpus.effective")).trim().to_string();
            let cpus = crate::live::parse_cpu_list(&parent).expect("cpu list");
            trial.set_cpus(&cpus[..1]).expect("cpuset.cpus");
            let one = crate::live::format_cpu_list(&cpus[..1]);
            assert_eq!((file("cpuset.cpus"), cpus_allowed(pid)), (one.clone(), one));
            trial.set_cpus(&cpus).expect("cpuset.cpus");
            assert_eq!(cpus_allowed(pid), crate::live::format_cpu_list(&cpus), "the affinity follows the cpuset");
        } else {
            eprintln!("cpuset controller not usable here: cpuset.cpus not tested for real");
            assert!(trial.set_cpus(&[0]).is_err());
        }
        if trial.controllers().cpu {
            trial.set_cpu_max(Some((20_000, 100_000))).expect("cpu.max");
            assert_eq!(file("cpu.max"), "20000 100000");
            trial.set_cpu_max(None).expect("cpu.max");
            assert_eq!(file("cpu.max"), "max 100000");
        } else {
            eprintln!("cpu controller not usable here: cpu.max not tested for real");
            assert!(trial.set_cpu_max(None).is_err());
        }
    }

    #[test]
    fn a_real_delegated_cgroup_moves_its_processes_to_the_leaf_first() {
        let root = match real_root() {
            Ok(root) => root,
            Err(why) => return eprintln!("skipped: {why}"),
        };
        let mut cleanup = Cleanup::default();
        let name = test_name("delegated");
        let own = root.join(&name);
        fs::create_dir(&own).expect("the stand-in for a unit's cgroup");
        cleanup.dirs.extend([own.clone(), own.join(AGENT_LEAF)]);
        let agent = cleanup.sleeper();
        fs::write(own.join("cgroup.procs"), agent.to_string()).expect("the stand-in agent joins it");

        let cg = CgroupV2::delegated(&root, Path::new(&name)).expect("delegated");
        assert_eq!(read(&own.join("cgroup.procs")), "", "no process left beside the children");
        assert_eq!(cgroup_of(agent), format!("{name}/{AGENT_LEAF}"));
        // Enabling a controller for the children is refused while a process
        // is in the cgroup: every one offered got enabled.
        let offered = Controllers::read(&own.join("cgroup.controllers")).and(Controllers::ALL);
        assert_eq!(cg.controllers(), offered);
        eprintln!("the stand-in delegated cgroup offers {offered}");

        let trial = cg.create("trial").expect("trial cgroup");
        cleanup.dirs.push(trial.path().to_path_buf());
        let workload = cleanup.sleeper();
        trial.add(workload).expect("move the workload");
        assert_eq!(cgroup_of(workload), format!("{name}/trial"), "a sibling of the agent's leaf");
    }
}
