//! Who holds a session lease, and whether that holder is provably gone: an acquirer that sees
//! the holder's process table can ask the OS whether it still runs, and take a dead holder's
//! lease over at once; elsewhere (another machine, container or user, no `/proc`) the TTL
//! decides. Inside one process, holders ([`LocalOwner`]) are told apart by an instance number.

use crate::Unpoisoned;
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

use serde::{Deserialize, Serialize};

/// Who holds (or asks for) a session's lease: a host process, and which holder inside it. Two
/// owners are the same only if every field is equal.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LeaseOwner {
    /// The host name of the holder's machine (for people: machines are told apart by
    /// [`ProcessIdentity::space`], never by name).
    pub host: String,
    /// The holder's process id.
    pub pid: u32,
    /// When the holder's process started (ms since the Unix epoch), from the OS where it tells
    /// (Linux), else when rethread was first used in that process.
    pub started_at_ms: i64,
    /// Which holder inside the process (a counter, unique within the process).
    pub instance: u64,
    /// The holder process as the OS identifies it, when it does (Linux); `None`: only the TTL
    /// frees its lease.
    #[serde(default)]
    pub process: Option<ProcessIdentity>,
}

/// A process as the OS identifies it: which process table, and which incarnation of the pid.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ProcessIdentity {
    /// The process table the pid belongs to, and who may look at it: on Linux
    /// `linux boot=<boot id> pidns=<pid namespace inode> uid=<uid>`. Two processes with equal
    /// spaces can ask the OS about each other's pid.
    pub space: String,
    /// The process's start time in clock ticks since boot (tells a reused pid apart).
    pub start_ticks: u64,
}

impl ProcessIdentity {
    /// The identity from two nullable columns: both set, or neither (`Ok(None)`); one without
    /// the other is damage.
    #[cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))]
    pub(crate) fn from_columns(
        space: Option<String>,
        start_ticks: Option<i64>,
    ) -> Result<Option<ProcessIdentity>, &'static str> {
        match (space, start_ticks) {
            (Some(space), Some(start)) => Ok(Some(ProcessIdentity {
                space,
                start_ticks: start as u64,
            })),
            (None, None) => Ok(None),
            _ => Err("half a process identity"),
        }
    }

    /// The identity of process `pid` as this process sees it, if the OS tells (Linux: from
    /// `/proc`); `None` elsewhere, or if the process does not exist or cannot be inspected.
    pub fn of_pid(pid: u32) -> Option<ProcessIdentity> {
        os::identity_of(pid).map(|(identity, _)| identity)
    }
}

impl LeaseOwner {
    /// Whether this owner's process is provably gone: it ran in this process's process table
    /// (same [`ProcessIdentity::space`]) and its pid is no longer running, is a zombie, or now
    /// belongs to a process that started at another time; inside this very process, its
    /// [`LocalOwner`] was dropped. `false` whenever that cannot be established.
    pub fn is_known_gone(&self) -> bool {
        let (Some(theirs), Some(here)) = (&self.process, this_process()) else {
            return false;
        };
        if theirs.space != here.identity.space {
            return false;
        }
        if self.pid == here.pid && theirs.start_ticks == here.identity.start_ticks {
            return !live_instances().contains(&self.instance);
        }
        os::is_gone(self.pid, theirs.start_ticks)
    }
}

impl std::fmt::Display for LeaseOwner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "host {} pid {}", self.host, self.pid)
    }
}

/// A lease holder in this process, named by its [`owner`](LocalOwner::owner). Once it is
/// dropped, another holder on this machine takes its leases over at once
/// ([`LeaseOwner::is_known_gone`]).
#[derive(Debug)]
pub struct LocalOwner {
    owner: LeaseOwner,
}

impl LocalOwner {
    /// A new holder: this host and process, and a new instance number.
    pub fn new() -> Self {
        static INSTANCE: AtomicU64 = AtomicU64::new(1);
        let instance = INSTANCE.fetch_add(1, Ordering::Relaxed);
        live_instances().insert(instance);
        let (host, started_at_ms, process) = match this_process() {
            Some(here) => (
                here.host.clone(),
                here.started_at_ms,
                Some(here.identity.clone()),
            ),
            None => (host_name(), first_use_ms(), None),
        };
        LocalOwner {
            owner: LeaseOwner {
                host,
                pid: std::process::id(),
                started_at_ms,
                instance,
                process,
            },
        }
    }

    /// The owner this holder's leases name.
    pub fn owner(&self) -> &LeaseOwner {
        &self.owner
    }
}

impl Default for LocalOwner {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for LocalOwner {
    fn drop(&mut self) {
        live_instances().remove(&self.owner.instance);
    }
}

/// Instances of this process whose [`LocalOwner`] is alive.
fn live_instances() -> MutexGuard<'static, HashSet<u64>> {
    static LIVE: OnceLock<Mutex<HashSet<u64>>> = OnceLock::new();
    LIVE.get_or_init(Default::default).lock().unpoisoned()
}

/// This process, as the OS identifies it.
struct ThisProcess {
    pid: u32,
    host: String,
    started_at_ms: i64,
    identity: ProcessIdentity,
}

fn this_process() -> Option<&'static ThisProcess> {
    static THIS: OnceLock<Option<ThisProcess>> = OnceLock::new();
    let this = THIS
        .get_or_init(|| {
            let pid = std::process::id();
            os::own_identity(pid).map(|(identity, started_at_ms)| ThisProcess {
                pid,
                host: host_name(),
                started_at_ms,
                identity,
            })
        })
        .as_ref()?;
    // A forked child is another process: it must not pass for its parent.
    (this.pid == std::process::id()).then_some(this)
}

fn host_name() -> String {
    let name = gethostname::gethostname()
        .to_string_lossy()
        .trim()
        .to_string();
    if name.is_empty() {
        return "localhost".to_string();
    }
    name
}

fn first_use_ms() -> i64 {
    static FIRST: OnceLock<i64> = OnceLock::new();
    *FIRST.get_or_init(|| crate::Clock::system().now_ms())
}

#[cfg(target_os = "linux")]
mod os {
    //! `/proc`: identity and liveness of a process.

    use procfs::process::Process;
    use procfs::ProcError;

    use super::ProcessIdentity;

    /// The identity of `pid` and its start time in milliseconds since the Unix epoch.
    pub(super) fn identity_of(pid: u32) -> Option<(ProcessIdentity, i64)> {
        identity(&Process::new(i32::try_from(pid).ok()?).ok()?)
    }

    /// The identity of this process, whose pid is `pid`: read from `/proc/self`, never
    /// `/proc/<pid>`, which in a pid namespace without a `/proc` of its own names another
    /// process (and `/proc` answers for none of the namespace's pids: no identity then).
    pub(super) fn own_identity(pid: u32) -> Option<(ProcessIdentity, i64)> {
        let process = Process::myself().ok()?;
        if process.stat().ok()?.pid != i32::try_from(pid).ok()? {
            return None;
        }
        identity(&process)
    }

    fn identity(process: &Process) -> Option<(ProcessIdentity, i64)> {
        let stat = process.stat().ok()?;
        let uid = process.uid().ok()?;
        let pid_namespace = process
            .namespaces()
            .ok()?
            .0
            .get(std::ffi::OsStr::new("pid"))?
            .identifier;
        let boot_id = procfs::sys::kernel::random::boot_id().ok()?;
        let boot_id = boot_id.trim();
        if boot_id.is_empty() {
            return None;
        }
        let ticks_per_second = procfs::ticks_per_second().max(1);
        let boot_ms = i64::try_from(procfs::boot_time_secs().ok()?)
            .ok()?
            .saturating_mul(1000);
        let since_boot_ms = i64::try_from(stat.starttime.saturating_mul(1000) / ticks_per_second)
            .unwrap_or(i64::MAX);
        Some((
            ProcessIdentity {
                space: format!("linux boot={boot_id} pidns={pid_namespace} uid={uid}"),
                start_ticks: stat.starttime,
            },
            boot_ms.saturating_add(since_boot_ms),
        ))
    }

    /// Whether `pid` provably no longer runs the process that started at `start_ticks`.
    pub(super) fn is_gone(pid: u32, start_ticks: u64) -> bool {
        let Ok(pid) = i32::try_from(pid) else {
            return false;
        };
        let stat = match Process::new(pid).and_then(|p| p.stat()) {
            Ok(stat) => stat,
            // No such process (now). Any other failure proves nothing.
            Err(ProcError::NotFound(_)) => return true,
            Err(_) => return false,
        };
        // A zombie has exited; only its parent has not reaped it yet.
        matches!(stat.state, 'Z' | 'X' | 'x') || stat.starttime != start_ticks
    }
}

#[cfg(not(target_os = "linux"))]
mod os {
    //! No process identity: leases of such holders are freed by their TTL only.

    use super::ProcessIdentity;

    pub(super) fn identity_of(_pid: u32) -> Option<(ProcessIdentity, i64)> {
        None
    }

    pub(super) fn own_identity(_pid: u32) -> Option<(ProcessIdentity, i64)> {
        None
    }

    pub(super) fn is_gone(_pid: u32, _start_ticks: u64) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_live_local_owner_is_not_gone_and_a_dropped_one_is() {
        let holder = LocalOwner::new();
        let owner = holder.owner().clone();
        if owner.process.is_none() {
            // No process identity on this OS: nothing is ever judged gone.
            assert!(!owner.is_known_gone());
            return;
        }
        assert!(!owner.is_known_gone());
        drop(holder);
        assert!(owner.is_known_gone());
    }

    #[test]
    fn two_local_owners_differ_and_share_the_process_identity() {
        let (a, b) = (LocalOwner::new(), LocalOwner::new());
        assert_ne!(a.owner(), b.owner());
        assert_eq!(a.owner().process, b.owner().process);
        assert_eq!(a.owner().pid, std::process::id());
    }

    #[test]
    fn an_owner_without_identity_or_from_another_space_is_never_gone() {
        let here = LocalOwner::new().owner().clone();
        let unidentified = LeaseOwner {
            process: None,
            ..here.clone()
        };
        assert!(!unidentified.is_known_gone());
        let elsewhere = LeaseOwner {
            process: here.process.clone().map(|p| ProcessIdentity {
                space: format!("{} (another container)", p.space),
                ..p
            }),
            pid: 1,
            ..here
        };
        assert!(!elsewhere.is_known_gone());
    }

    /// In a pid namespace without a `/proc` of its own (`unshare --pid` without
    /// `--mount-proc`), `/proc/<getpid()>` is another process, and `/proc` answers for none of
    /// the namespace's pids: a holder there must record no identity (the TTL decides), never
    /// that other process's. Runs this test again in such a namespace, as the child of the
    /// namespace's pid 1 (its pid, 2 or so, then names a process of the outer `/proc`);
    /// skipped where `unshare` is missing or not allowed.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_pid_namespace_without_its_own_proc_records_no_identity() {
        const CHILD: &str = "RETHREAD_OWNER_TEST_IN_PID_NAMESPACE";
        const NAME: &str = "owner::tests::a_pid_namespace_without_its_own_proc_records_no_identity";
        if std::env::var_os(CHILD).is_some() {
            let seen_by_proc: u32 = std::fs::read_link("/proc/self")
                .ok()
                .and_then(|p| p.to_str()?.parse().ok())
                .expect("/proc/self");
            assert_ne!(seen_by_proc, std::process::id(), "not in a pid namespace");
            let owner = LocalOwner::new().owner().clone();
            assert_eq!(
                owner.process,
                None,
                "pid {} (/proc's {seen_by_proc}) recorded the identity of /proc/{}",
                std::process::id(),
                std::process::id()
            );
            return;
        }
        let exe = std::env::current_exe().expect("the test binary");
        let run = std::process::Command::new("unshare")
            .args([
                "--pid",
                "--fork",
                "sh",
                "-c",
                "true; \"$0\" \"$@\"; exit $?",
            ])
            .arg(exe)
            .args(["--exact", NAME, "--nocapture", "--test-threads=1"])
            .env(CHILD, "1")
            .output();
        let output = match run {
            Ok(output) => output,
            Err(error) => return eprintln!("skipping: no unshare ({error})"),
        };
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        if !stdout.contains("running 1 test") {
            return eprintln!("skipping: unshare --pid is not allowed here ({stderr})");
        }
        assert!(output.status.success(), "{stdout}\n{stderr}");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_reused_pid_or_an_exited_process_is_gone() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawn sleep");
        let identity = ProcessIdentity::of_pid(child.id()).expect("identity of a live child");
        let owner = LeaseOwner {
            host: "h".into(),
            pid: child.id(),
            started_at_ms: 0,
            instance: 0,
            process: Some(identity.clone()),
        };
        assert!(!owner.is_known_gone(), "a running child is alive");
        let reused = LeaseOwner {
            process: Some(ProcessIdentity {
                start_ticks: identity.start_ticks.wrapping_sub(1),
                ..identity
            }),
            ..owner.clone()
        };
        assert!(reused.is_known_gone(), "same pid, another start time");
        child.kill().expect("kill");
        // Unreaped, it is a zombie: gone too. SIGKILL lands asynchronously, so wait for it.
        let mut gone = false;
        for _ in 0..1000 {
            gone = owner.is_known_gone();
            if gone {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(gone, "a killed, unreaped child is gone");
        child.wait().expect("reap");
        assert!(owner.is_known_gone(), "a reaped child is gone");
    }
}
