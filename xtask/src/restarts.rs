//! `cargo xtask restarts [--kills N] [--exec-stops N] [--app-server-stops N] [--seed S]
//! [--backend B]... [--hosts chat|exec|app-server]... [--slow-turn-ms MS] [--lease-ttl SECS]`:
//! the restart harness of issues 12, 19 and 22 (docs/reliability.md).
//!
//! For each backend (SQLite, redb, and PostgreSQL when `RETHREAD_TEST_POSTGRES_URL` is set) and
//! each kind of host (default both), in parallel, against `fake-codex` (threads kept in a
//! `CODEX_HOME` shared by the run; sometimes the bound thread is first made unresumable, `no
//! rollout found`, so fallbacks happen):
//!
//! - `chat` (`restarts/run.rs`): `rethread chat --json` processes for one session and one turn, stopped
//!   with their codex at random points of the turn by SIGKILL, or sometimes SIGINT (a
//!   terminal's Ctrl-C) or SIGTERM, each stop followed at once by a new process for the same
//!   session. After every process:
//!   1. the restart ran without waiting out the dead holder's lease (TTL 30 s);
//!   2. it resumed the bound thread unless that thread was lost (then it fell back);
//!   3. every acknowledged turn (exit 0 with a reply) is in the transcript, once;
//!   4. no retired thread is bound;
//!   5. each give-up write (the store's retired threads grew) is told by exactly one notice,
//!      in the first acknowledged turn after it (in its report and on its stderr); the cases
//!      counted apart (`unacked`) are a host killed after committing that first turn and
//!      before its report (its reply is lost with it), which must have said the notice on
//!      stderr before the commit, and a host stopped after it said the notice and recorded
//!      it delivered (never said again, design rule 4).
//!   6. a process stopped by SIGINT or SIGTERM that did not finish first exits 130 / 143 with
//!      an `interrupted` report, and then committed nothing (it said the turn was not
//!      committed).
//!   7. a host killed alone (SIGKILL to its pid, not its group; its fake turn made 30 s long)
//!      leaves no process of its group (its codex) running 5 s after it was reaped.
//! - `exec` (`restarts/run.rs` too): `rethread exec --experimental-json` processes, one turn
//!   each with the prompt on stdin (the TypeScript SDK's way), stopped and checked as the
//!   `chat` hosts are: its JSONL is read as `chat`'s report would be (`thread.started`, the
//!   agent message, the notice as an `error` item; an interrupted host says so on stderr).
//! - `app-server` (`restarts/proxy_run.rs`, `restarts/client.rs`): `rethread app-server`
//!   processes for the session `RETHREAD_SESSION` names, with `RETHREAD_LEASE_TTL` short
//!   (`--lease-ttl`, default 1.5 s), driven by a JSON-RPC client, stopped by SIGKILL (to its
//!   group, or to its pid alone: then, as check 7 above, no process of its group may be left
//!   5 s after it was reaped), SIGTERM or SIGSTOP past the TTL (then SIGCONT; half of them
//!   with a rival host run meanwhile). The
//!   checks are in `restarts/proxy_run/checks.rs` and docs/reliability.md; two of them
//!   (issue 19 items 2 and 7, which they caught) are counted and fail the run at its end:
//!   `--hosts chat` runs without them.
//!
//! `cargo xtask ci` runs 300 chat stops, 150 exec stops and 40 app-server stops per backend.

mod client;
mod host;
mod proxy_run;
mod report;
mod run;
mod view;

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::util;

/// The kinds of host a run can drive.
const HOSTS: [&str; 3] = ["chat", "exec", "app-server"];

/// The options of a run.
#[derive(Debug, Clone)]
struct Options {
    kills: u32,
    exec_stops: u32,
    app_server_stops: u32,
    seed: u64,
    backends: Vec<String>,
    hosts: Vec<String>,
    slow_turn_ms: u64,
    lease_ttl: f64,
}

/// `cargo xtask restarts ARGS`.
pub(crate) fn command(args: &[String]) -> Result<(), String> {
    let mut options = Options {
        kills: 300,
        exec_stops: 300,
        app_server_stops: 40,
        seed: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64),
        backends: Vec::new(),
        hosts: Vec::new(),
        slow_turn_ms: 40,
        lease_ttl: 1.5,
    };
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let mut value = |name: &str| {
            args.next()
                .cloned()
                .ok_or_else(|| format!("{name} needs a value"))
        };
        let number = |text: String, name: &str| {
            text.parse::<u64>()
                .map_err(|_| format!("{name}: `{text}` is not a number"))
        };
        match arg.as_str() {
            "--kills" => options.kills = number(value("--kills")?, "--kills")? as u32,
            "--exec-stops" => {
                options.exec_stops = number(value("--exec-stops")?, "--exec-stops")? as u32
            }
            "--app-server-stops" => {
                options.app_server_stops =
                    number(value("--app-server-stops")?, "--app-server-stops")? as u32
            }
            "--seed" => options.seed = number(value("--seed")?, "--seed")?,
            "--slow-turn-ms" => {
                options.slow_turn_ms = number(value("--slow-turn-ms")?, "--slow-turn-ms")?
            }
            "--lease-ttl" => {
                let text = value("--lease-ttl")?;
                options.lease_ttl = text
                    .parse::<f64>()
                    .ok()
                    .filter(|secs| (0.1..=60.0).contains(secs))
                    .ok_or_else(|| format!("--lease-ttl: `{text}` is not 0.1 to 60 seconds"))?;
            }
            "--backend" => options.backends.push(value("--backend")?),
            "--hosts" => {
                let hosts = value("--hosts")?;
                if !HOSTS.contains(&hosts.as_str()) {
                    return Err(format!(
                        "--hosts: `{hosts}` is not chat, exec or app-server"
                    ));
                }
                options.hosts.push(hosts);
            }
            other => return Err(format!("restarts: unknown argument `{other}`")),
        }
    }
    if options.hosts.is_empty() {
        options.hosts = HOSTS.iter().map(|h| h.to_string()).collect();
    }
    run_all(&options)
}

/// The bounded run of `cargo xtask ci`: 300 `chat` stops, 150 `exec` stops and 40
/// `app-server` stops per backend, PostgreSQL included when `RETHREAD_TEST_POSTGRES_URL` is
/// set.
pub(crate) fn ci() -> Result<(), String> {
    command(&[
        "--kills".to_string(),
        "300".to_string(),
        "--exec-stops".to_string(),
        "150".to_string(),
        "--app-server-stops".to_string(),
        "40".to_string(),
    ])
}

/// One backend's run of one kind of host.
enum Plan {
    Chat(run::Plan),
    AppServer(proxy_run::Plan),
}

/// What a run counted (and, for `app-server`, the checks that failed).
enum Counted {
    Chat(report::Stats),
    AppServer(report::ProxyStats, Vec<String>),
}

fn run_all(options: &Options) -> Result<(), String> {
    let root = util::project_root();
    util::build_rethread_and(&["-p", "rethread-fake-appserver", "--bin", "fake-codex"])?;
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
    let binaries = host::Binaries {
        rethread: target.join("debug").join("rethread"),
        fake_codex: target.join("debug").join("fake-codex"),
    };
    let postgres = std::env::var("RETHREAD_TEST_POSTGRES_URL").ok();
    let wanted: Vec<&str> = if options.backends.is_empty() {
        vec!["sqlite", "redb", "postgres"]
    } else {
        options.backends.iter().map(String::as_str).collect()
    };
    let mut plans = Vec::new();
    for (index, backend) in wanted.iter().enumerate() {
        for hosts in &options.hosts {
            // Each kind of host has a store of its own (redb admits one process at a time).
            let dir = match hosts.as_str() {
                "chat" => target.join("restarts").join(backend),
                _ => target.join("restarts").join(format!("{backend}-{hosts}")),
            };
            let (name, url) = match *backend {
                "sqlite" => (
                    "sqlite",
                    format!("sqlite:{}", dir.join("store.sqlite").display()),
                ),
                "redb" => ("redb", format!("redb:{}", dir.join("store.redb").display())),
                "postgres" => match &postgres {
                    Some(url) => ("postgres", url.clone()),
                    None if options.backends.is_empty() => {
                        if hosts == &options.hosts[0] {
                            println!(
                                "restarts: PostgreSQL skipped: RETHREAD_TEST_POSTGRES_URL is \
                                 not set (`source .ci/postgres.sh && rethread_start_postgres` \
                                 sets it)"
                            );
                        }
                        continue;
                    }
                    None => {
                        return Err("--backend postgres needs RETHREAD_TEST_POSTGRES_URL".into())
                    }
                },
                other => {
                    return Err(format!(
                        "unknown backend `{other}` (sqlite, redb, postgres)"
                    ))
                }
            };
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(dir.join("codex-home"))
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
            let seed = options.seed.wrapping_add(index as u64 * 0x9E37_79B9);
            let session_prefix = format!(
                "restarts-{}-{}-{name}-{hosts}",
                options.seed,
                std::process::id()
            );
            plans.push(match hosts.as_str() {
                kind @ ("chat" | "exec") => Plan::Chat(run::Plan {
                    kind: if kind == "chat" {
                        host::Kind::Chat
                    } else {
                        host::Kind::Exec
                    },
                    backend: name,
                    host_store_url: view::host_store_url(&url, kind),
                    store_url: url,
                    dir,
                    session_prefix,
                    kills: if kind == "chat" {
                        options.kills
                    } else {
                        options.exec_stops
                    },
                    seed: if kind == "chat" { seed } else { seed ^ 0xE8EC },
                    slow_turn_ms: options.slow_turn_ms,
                }),
                _ => Plan::AppServer(proxy_run::Plan {
                    backend: name,
                    host_store_url: view::host_store_url(&url, "app-server"),
                    store_url: url,
                    dir,
                    session_prefix,
                    stops: options.app_server_stops,
                    seed: seed ^ 0xA99_5E4E,
                    slow_turn_ms: options.slow_turn_ms,
                    lease_ttl: options.lease_ttl,
                }),
            });
        }
    }
    println!(
        "restarts: {} chat stops, {} exec stops and {} app-server stops per backend ({}), seed \
         {}, turns of {} ms, app-server lease TTL {} s (replay: --seed {})",
        options.kills,
        options.exec_stops,
        options.app_server_stops,
        options.hosts.join(", "),
        options.seed,
        options.slow_turn_ms,
        options.lease_ttl,
        options.seed
    );
    let results: Vec<(String, Result<Counted, String>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = plans
            .iter()
            .map(|plan| {
                let binaries = &binaries;
                let (name, handle) = match plan {
                    Plan::Chat(plan) => (
                        format!(
                            "{} {}",
                            plan.backend,
                            if plan.kind == host::Kind::Chat {
                                "chat"
                            } else {
                                "exec"
                            }
                        ),
                        scope.spawn(move || run::execute(plan, binaries).map(Counted::Chat)),
                    ),
                    Plan::AppServer(plan) => (
                        format!("{} app-server", plan.backend),
                        scope.spawn(move || {
                            proxy_run::execute(plan, binaries)
                                .map(|(stats, known)| Counted::AppServer(stats, known))
                        }),
                    ),
                };
                (name, handle)
            })
            .collect();
        handles
            .into_iter()
            .map(|(name, handle)| {
                let result = handle
                    .join()
                    .unwrap_or_else(|_| Err("the run panicked".to_string()));
                (name, result)
            })
            .collect()
    });
    let backend = |name: &str| name.split(' ').next().unwrap_or_default().to_string();
    let one_turn_hosts = |kind: &str| -> Vec<(String, &report::Stats)> {
        results
            .iter()
            .filter(|(name, _)| name.ends_with(kind))
            .filter_map(|(name, result)| match result {
                Ok(Counted::Chat(stats)) => Some((backend(name), stats)),
                _ => None,
            })
            .collect()
    };
    let (chat, exec) = (one_turn_hosts(" chat"), one_turn_hosts(" exec"));
    let proxy: Vec<(String, &report::ProxyStats)> = results
        .iter()
        .filter_map(|(name, result)| match result {
            Ok(Counted::AppServer(stats, _)) => Some((backend(name), stats)),
            _ => None,
        })
        .collect();
    if !chat.is_empty() {
        let rows: Vec<(&str, &report::Stats)> =
            chat.iter().map(|(b, s)| (b.as_str(), *s)).collect();
        println!("\nrethread chat hosts:\n{}", report::table(&rows));
    }
    if !exec.is_empty() {
        let rows: Vec<(&str, &report::Stats)> =
            exec.iter().map(|(b, s)| (b.as_str(), *s)).collect();
        println!("\nrethread exec hosts:\n{}", report::table(&rows));
    }
    if !proxy.is_empty() {
        let rows: Vec<(&str, &report::ProxyStats)> =
            proxy.iter().map(|(b, s)| (b.as_str(), *s)).collect();
        println!(
            "\nrethread app-server hosts:\n{}",
            report::proxy_table(&rows)
        );
    }
    let failures: Vec<String> = results
        .iter()
        .flat_map(|(name, result)| match result {
            Err(error) => vec![format!("{name}: {error}")],
            Ok(Counted::AppServer(_, known)) => {
                known.iter().map(|k| format!("{name}: {k}")).collect()
            }
            Ok(Counted::Chat(_)) => Vec::new(),
        })
        .collect();
    if failures.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "restart checks failed (seed {}):\n{}",
            options.seed,
            failures.join("\n")
        ))
    }
}
