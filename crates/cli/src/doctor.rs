//! `rethread doctor`: probe each binding without resuming it ([`probe_thread`]: reads only,
//! classified by the same rule as a failed resume).
//!
//! With no binding to probe it starts no codex. Up to `--jobs` probes run at once on one codex
//! connection; a probe that fails outright (the connection closed, a timeout) is a row of
//! status `error`, and the run goes on. The report lists the bindings in session order. A
//! thread gone from this `CODEX_HOME` whose rollout the store mirrors is `restorable` (its next
//! open restores it), or `gone` with mirroring off (that open restores nothing) or when the
//! store's check of the mirrored files (the one `verify` and the restore make) finds damage
//! (that open cannot restore them). Exit 1 when
//! any binding's next turn would start a new thread, after the whole report.

use comfy_table::{Cell, Color};
use futures::StreamExt;
use rethread_runtime::{probe_thread, AppServerClient, RolloutMirror, StatusRail, ThreadHealth};
use rethread_store::{Binding, BindingStore, StoreError};
use serde_json::json;

use crate::output::{self, for_people, outln, UsageError};
use crate::{open_store, Access, CliResult, CodexBinArg, StoreArg};

/// One row of the report.
struct Row {
    session: String,
    binding: Binding,
    health: ThreadHealth,
    detail: String,
}

/// A binding to probe: the session, its binding, and the paths of its thread's mirrored
/// rollout files (empty when the store cannot restore it).
type Bound = (String, Binding, Vec<String>);

#[derive(Debug, clap::Args)]
pub(crate) struct DoctorArgs {
    #[command(flatten)]
    pub(crate) store: StoreArg,
    #[command(flatten)]
    pub(crate) codex_bin: CodexBinArg,
    /// Print one JSON object: `bindings` (each `session`, `thread_id`, `codex_home`,
    /// `status`, `detail`), `total`, `summary` (a count per status), `all_live`,
    /// `mirror_cap_bytes` (the cap) and `near_mirror_cap` (each `session` and its
    /// `mirror_bytes`: mirrors holding 90 % of the cap or more).
    #[arg(long)]
    json: bool,
    /// Probes to run at once (1-64).
    #[arg(long, value_name = "N", default_value_t = 4,
          value_parser = clap::value_parser!(u16).range(1..=64))]
    jobs: u16,
}

/// Probes every binding on one codex, `--jobs` at once.
pub(crate) async fn run(args: DoctorArgs) -> CliResult {
    // What the next open will do with a mirrored rollout: doctor reports that.
    let mirror = crate::mirror(false)?;
    let store = open_store(args.store.url.as_deref(), Access::Inspect).await?;
    let bound = bindings(&store).await?;
    let (cap, near_cap) = near_mirror_cap(&store).await?;
    let mut rows = Vec::new();
    if !bound.is_empty() {
        let client = AppServerClient::builder()
            .rail(StatusRail::tracing())
            // Resolved only now: with no binding, no codex is needed.
            .spawn(&crate::codex_child::codex_command(
                &args.codex_bin.resolve()?,
            ))
            .await?;
        let bar = output::progress(bound.len() as u64, "probing");
        rows = probe_all(bound, args.jobs.into(), |bound| {
            let (client, bar, store) = (client.clone(), bar.clone(), store.clone());
            async move {
                let row = probe(&client, &store, bound, mirror).await;
                bar.inc(1);
                row
            }
        })
        .await;
        output::finish(&bar);
        client.shutdown().await;
    }
    let count = |health| rows.iter().filter(|r| r.health == health).count();
    let not_live = rows.iter().filter(|r| !r.health.resumes()).count();
    if args.json {
        let bindings: Vec<_> = rows
            .iter()
            .map(|r| {
                json!({"session": r.session, "thread_id": r.binding.thread_id,
                       "codex_home": r.binding.codex_home, "status": r.health.as_str(),
                       "detail": r.detail})
            })
            .collect();
        let summary: serde_json::Map<_, _> = ThreadHealth::ALL
            .iter()
            .map(|h| (h.as_str().to_string(), json!(count(*h))))
            .collect();
        // all_live: every binding resumes on its next turn (live, or restorable).
        let near_cap: Vec<_> = near_cap
            .iter()
            .map(|(session, bytes)| json!({"session": session, "mirror_bytes": bytes}))
            .collect();
        let report = json!({"bindings": bindings, "total": rows.len(), "summary": summary,
                            "all_live": not_live == 0, "mirror_cap_bytes": cap,
                            "near_mirror_cap": near_cap});
        outln!("{report}");
    } else {
        if !rows.is_empty() {
            let mut table = output::table();
            table.set_header(["SESSION", "THREAD", "STATUS", "DETAIL"]);
            table.add_rows(rows.iter().map(|row| {
                let colour = match row.health {
                    ThreadHealth::Live => Color::Green,
                    ThreadHealth::Restorable => Color::Yellow,
                    _ => Color::Red,
                };
                [
                    Cell::new(for_people(&row.session)),
                    Cell::new(for_people(&row.binding.thread_id)),
                    Cell::new(row.health.as_str()).fg(colour),
                    Cell::new(for_people(&row.detail)),
                ]
            }));
            output::print_table(&mut table);
        }
        let parts: Vec<String> = ThreadHealth::ALL
            .iter()
            .filter(|h| count(**h) > 0)
            .map(|h| format!("{} {}", count(*h), h.as_str()))
            .collect();
        let parts = match parts.is_empty() {
            true => String::new(),
            false => format!(": {}", parts.join(", ")),
        };
        outln!("{} binding(s){parts}", rows.len());
    }
    if not_live > 0 {
        let total = rows.len();
        return Err(format!(
            "{not_live} of {total} binding(s) not live; their next turn starts a new thread"
        )
        .into());
    }
    Ok(())
}

/// Every published binding, read a page at a time (only the bindings are kept).
async fn bindings(store: &BindingStore) -> CliResult<Vec<Bound>> {
    let mut out = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = store.list_sessions(after.as_deref(), 256).await?;
        out.extend(page.sessions.into_iter().filter_map(|s| {
            let binding = s.binding().cloned()?;
            let paths = match RolloutMirror::can_restore(&s, &binding.thread_id) {
                true => s
                    .mirror
                    .files_of(&binding.thread_id)
                    .map(|f| f.path.clone())
                    .collect(),
                false => Vec::new(),
            };
            Some((s.session_id, binding, paths))
        }));
        match page.next_after {
            Some(next) => after = Some(next),
            None => return Ok(out),
        }
    }
}

/// Runs `probe` on every binding, at most `jobs` at once; the rows in session order.
async fn probe_all<F, Fut>(bound: Vec<Bound>, jobs: usize, probe: F) -> Vec<Row>
where
    F: FnMut(Bound) -> Fut,
    Fut: std::future::Future<Output = Row>,
{
    let mut rows: Vec<Row> = futures::stream::iter(bound)
        .map(probe)
        .buffer_unordered(jobs.max(1))
        .collect()
        .await;
    rows.sort_by(|a, b| a.session.cmp(&b.session));
    rows
}

/// Probes one binding; a probe that could not be made is an `error` row. A gone thread with
/// mirrored files (`paths`) is `restorable` only with `mirror` on (otherwise the next open
/// restores nothing) and when the store reads them back intact.
async fn probe(
    client: &AppServerClient,
    store: &BindingStore,
    (session, binding, paths): Bound,
    mirror: bool,
) -> Row {
    let (health, detail) = match probe_thread(client, &binding.thread_id).await {
        Ok(probe) if probe.health != ThreadHealth::Gone || paths.is_empty() => {
            (probe.health, probe.detail)
        }
        Ok(probe) if !mirror => (
            ThreadHealth::Gone,
            format!(
                "{}; the store mirrors its rollout, but mirroring is off (RETHREAD_MIRROR=off)",
                probe.detail
            ),
        ),
        Ok(probe) => match mirror_damage(store, &session, &binding, &paths).await {
            Ok(None) => (
                ThreadHealth::Restorable,
                format!("{}; the store mirrors its rollout", probe.detail),
            ),
            Ok(Some(damage)) => (
                ThreadHealth::Gone,
                format!(
                    "{}; the store's mirror of its rollout is damaged, `rethread verify` \
                     lists it: {damage}",
                    probe.detail
                ),
            ),
            Err(error) => (
                ThreadHealth::Error,
                format!("{}; cannot read its mirror: {error}", probe.detail),
            ),
        },
        Err(error) => (ThreadHealth::Error, format!("probe failed: {error}")),
    };
    Row {
        session,
        binding,
        health,
        detail,
    }
}

/// Reads each mirrored file back as a restore does, checked by the store (chunks, length and
/// CRC-32: the check `verify` makes), keeping nothing; the damage found, if any. A file no
/// longer mirrored is damage too: the restore would lack it.
async fn mirror_damage(
    store: &BindingStore,
    session: &str,
    binding: &Binding,
    paths: &[String],
) -> Result<Option<String>, StoreError> {
    for path in paths {
        let out = Box::new(std::io::sink());
        match store
            .write_mirror_file(session, &binding.thread_id, path, out)
            .await
        {
            Ok(Some(_)) => {}
            Ok(None) => return Ok(Some(format!("{path} is no longer mirrored"))),
            Err(StoreError::Corrupt { detail, .. }) => return Ok(Some(detail)),
            Err(error) => return Err(error),
        }
    }
    Ok(None)
}

/// The cap (`RETHREAD_MIRROR_CAP`, else 1 GiB of rollout bytes) and the sessions whose mirrors hold at least
/// 90 % of it, with their mirrored bytes; each is also said on stderr (a notice, also under
/// `--json`): past the cap mirroring stops for their thread.
async fn near_mirror_cap(store: &BindingStore) -> CliResult<(u64, Vec<(String, u64)>)> {
    let cap = std::env::var_os(rethread_runtime::MIRROR_CAP_ENV);
    let cap = rethread_runtime::mirror_cap_setting(cap.as_deref()).map_err(UsageError)?;
    let mut near = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = store.list_sessions(after.as_deref(), 256).await?;
        for s in &page.sessions {
            let bytes = s.mirror.bytes();
            if !s.mirror.stopped && bytes.saturating_mul(10) >= cap.saturating_mul(9) {
                output::eprint_line(&format!(
                    "rethread: session {} mirrors {bytes} bytes, near its cap of {cap} \
                     (RETHREAD_MIRROR_CAP): past it, mirroring stops for its thread",
                    for_people(&s.session_id)
                ));
                near.push((s.session_id.clone(), bytes));
            }
        }
        match page.next_after {
            Some(next) => after = Some(next),
            None => return Ok((cap, near)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use tokio::sync::Barrier;

    use super::*;

    fn bound(n: usize) -> Vec<Bound> {
        (0..n)
            .rev()
            .map(|i| {
                let binding = Binding::new(format!("t{i}"), None, 0);
                (format!("s{i}"), binding, Vec::new())
            })
            .collect()
    }

    /// Exactly `jobs` probes run at once: each waits at a barrier of `jobs` (so fewer at once
    /// would never finish) and a gauge of those in flight never passes `jobs`.
    #[tokio::test]
    async fn exactly_jobs_probes_run_at_once() {
        for jobs in [1, 2, 3] {
            let barrier = Arc::new(Barrier::new(jobs));
            let in_flight = Arc::new(AtomicUsize::new(0));
            let most = Arc::new(AtomicUsize::new(0));
            let probed = probe_all(bound(jobs * 4), jobs, |(session, binding, _)| {
                let (barrier, in_flight, most) = (barrier.clone(), in_flight.clone(), most.clone());
                async move {
                    let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    barrier.wait().await;
                    in_flight.fetch_sub(1, Ordering::SeqCst);
                    Row {
                        session,
                        binding,
                        health: ThreadHealth::Live,
                        detail: String::new(),
                    }
                }
            });
            let rows = tokio::time::timeout(std::time::Duration::from_secs(30), probed)
                .await
                .unwrap_or_else(|_| panic!("fewer than {jobs} probes ran at once"));
            assert_eq!(most.load(Ordering::SeqCst), jobs);
            let sessions: Vec<String> = rows.into_iter().map(|r| r.session).collect();
            let mut sorted = sessions.clone();
            sorted.sort();
            assert_eq!(sessions, sorted, "the report is in session order");
            assert_eq!(sessions.len(), jobs * 4);
        }
    }
}
