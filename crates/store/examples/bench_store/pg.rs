//! The PostgreSQL rows of the store benchmark: the store beside a raw tokio-postgres baseline.

use super::*;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use rethread_store::BindingStore;
use std::str::FromStr;

pub(crate) struct Raw {
    pool: Pool,
    schema: String,
}

impl Raw {
    pub(crate) async fn new(url: &str, schema: &str) -> Raw {
        let config = tokio_postgres::Config::from_str(url).unwrap();
        let manager = Manager::from_config(
            config,
            tokio_postgres::NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager).max_size(16).build().unwrap();
        let client = pool.get().await.unwrap();
        client
            .batch_execute(&format!(
                "CREATE SCHEMA {schema};
                 CREATE TABLE {schema}.sessions (session_id TEXT PRIMARY KEY, model_config TEXT, row_count BIGINT);
                 CREATE TABLE {schema}.transcript_rows (session_id TEXT, seq BIGINT, body TEXT, PRIMARY KEY (session_id, seq));"
            ))
            .await
            .unwrap();
        Raw {
            pool,
            schema: schema.to_string(),
        }
    }

    /// One turn's writes in one transaction, as the store does them (without its rules).
    async fn commit(&self, session: usize, turn: usize, rows: usize) {
        let s = &self.schema;
        let c = commit(session, turn, rows);
        let mut client = self.pool.get().await.unwrap();
        let txn = client.transaction().await.unwrap();
        let select = txn
            .prepare_cached(&format!(
                "SELECT row_count FROM {s}.sessions WHERE session_id = $1 FOR UPDATE"
            ))
            .await
            .unwrap();
        let seq0: i64 = txn
            .query_opt(&select, &[&c.session_id])
            .await
            .unwrap()
            .map(|r| r.get(0))
            .unwrap_or(0);
        let seqs: Vec<i64> = (0..c.rows.len() as i64).map(|i| seq0 + i).collect();
        let bodies: Vec<String> = c.rows.iter().map(|r| r.to_string()).collect();
        let insert = txn
            .prepare_cached(&format!(
                "INSERT INTO {s}.transcript_rows (session_id, seq, body) \
                 SELECT $1, q, b FROM unnest($2::int8[], $3::text[]) AS t(q, b)"
            ))
            .await
            .unwrap();
        txn.execute(&insert, &[&c.session_id, &seqs, &bodies])
            .await
            .unwrap();
        let upsert = txn
            .prepare_cached(&format!(
                "INSERT INTO {s}.sessions VALUES ($1, $2, $3) ON CONFLICT (session_id) \
                 DO UPDATE SET model_config = excluded.model_config, row_count = excluded.row_count"
            ))
            .await
            .unwrap();
        txn.execute(
            &upsert,
            &[
                &c.session_id,
                &record_json().to_string(),
                &(seq0 + rows as i64),
            ],
        )
        .await
        .unwrap();
        txn.commit().await.unwrap();
    }
}

pub(crate) async fn raw_one(raw: &Raw, args: Args, seconds: f64, offset: usize) -> Result {
    let mut latencies = Vec::new();
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(seconds);
    let mut n = 0;
    while Instant::now() < deadline {
        let t = Instant::now();
        raw.commit(0, offset + n, args.rows).await;
        latencies.push(t.elapsed());
        n += 1;
    }
    Result {
        name: "raw tokio-postgres transaction, 1 session".to_string(),
        commits: n,
        elapsed: start.elapsed(),
        latencies,
    }
}

pub(crate) async fn raw_many(raw: Arc<Raw>, args: Args) -> Result {
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(args.seconds);
    let tasks: Vec<_> = (0..args.sessions)
        .map(|s| {
            let raw = Arc::clone(&raw);
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                let mut n = 0;
                while Instant::now() < deadline {
                    let t = Instant::now();
                    raw.commit(s + 1, n, args.rows).await;
                    latencies.push(t.elapsed());
                    n += 1;
                }
                latencies
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for t in tasks {
        latencies.extend(t.await.unwrap());
    }
    Result {
        name: format!("raw tokio-postgres transaction, {} sessions", args.sessions),
        commits: latencies.len(),
        elapsed: start.elapsed(),
        latencies,
    }
}

/// The PostgreSQL rows: raw and store alternate in rounds for 1 session, then N sessions.
pub(crate) async fn run(
    url: &str,
    args: Args,
    results: &mut Vec<Result>,
    checks: &mut Vec<String>,
) {
    const ROUNDS: usize = 6;
    let round = args.seconds / ROUNDS as f64;
    let tag = format!(
        "{}_{}",
        std::process::id(),
        Instant::now().elapsed().subsec_nanos()
    );
    let raw = Arc::new(Raw::new(url, &format!("bench_raw_{tag}")).await);
    let sep = if url.contains('?') { '&' } else { '?' };
    let store: BindingStore = BindingStore::postgres(
        &format!("{url}{sep}schema=bench_store_{tag}"),
        OpenOptions::new(),
    )
    .await
    .unwrap();
    let (mut raw_total, mut one) = (Result::default(), Result::default());
    for r in 0..ROUNDS {
        let offset = r * 1_000_000;
        raw_total.absorb(raw_one(&raw, args, round, offset).await);
        one.absorb(
            store_one(
                "postgres store, 1 session",
                store.clone(),
                args,
                round,
                offset,
            )
            .await,
        );
    }
    eprintln!("  {}: {:.0}/s", raw_total.name, raw_total.rate());
    eprintln!("  {}: {:.0}/s", one.name, one.rate());
    let raw_n = raw_many(Arc::clone(&raw), args).await;
    eprintln!("  {}: {:.0}/s", raw_n.name, raw_n.rate());
    let many = store_many(
        &format!("postgres store, {} sessions", args.sessions),
        store.clone(),
        args,
    )
    .await;
    eprintln!("  {}: {:.0}/s", many.name, many.rate());
    checks.push(format!(
        "postgres: 1 session at {:.0}% of raw tokio-postgres; {} sessions at {:.0}% of raw",
        100.0 * one.rate() / raw_total.rate(),
        args.sessions,
        100.0 * many.rate() / raw_n.rate()
    ));
    results.push(raw_total);
    results.push(one);
    results.push(raw_n);
    results.push(many);
}
