//! The PostgreSQL backend: tokio-postgres with a deadpool pool, for hosts on several machines.
//!
//! Every write is one transaction on a pooled connection that first takes a transaction-scoped
//! advisory lock on the session (`pg_advisory_xact_lock`), so that all writers of one session,
//! in any process on any machine, are serialised, also when the session does not exist yet;
//! writers of different sessions run in parallel. Under the lock it fetches what the operation
//! needs into a buffered view (`view.rs`), runs the shared rules of `logic` on it, and writes
//! back what they wrote. The time of a write (`updated_at_ms`, lease expiry) is the database
//! server's clock, read under the lock, so leases are judged by one clock whichever host asks.
//!
//! A read that needs one statement runs it alone; one that needs several (rows with their
//! record) runs them in a read-only `REPEATABLE READ` transaction (one snapshot). Tables live
//! in the URL's `schema` (query parameter, created if missing) or the connection's search
//! path; they are created or migrated on open (`schema.rs`).

mod codec;
mod error;
mod schema;
mod sql;
mod view;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::{IsolationLevel, NoTls};

use self::error::{map_pool_error, map_postgres_error};
use self::sql::Sql;
use crate::adapter::{Adapter, Backend};
use crate::logic::{Needs, ReadOp, WriteOp};
use crate::store::forward_binding_store;
use crate::{Durability, OpenOptions, StoreError};

/// A [`BindingStore`](crate::BindingStore) in a PostgreSQL database.
#[derive(Clone)]
pub struct PostgresStore {
    store: Adapter<Pg>,
}

forward_binding_store!([] PostgresStore, |this| this.store);

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("url", &self.store.0.label)
            .finish_non_exhaustive()
    }
}

/// The backend behind a [`PostgresStore`].
#[derive(Clone)]
pub(crate) struct Pg {
    pool: Pool,
    sql: Arc<Sql>,
    /// The URL, password redacted: how errors name this store.
    label: String,
    relaxed: bool,
}

impl std::fmt::Debug for Pg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pg")
            .field("url", &self.label)
            .finish_non_exhaustive()
    }
}

impl PostgresStore {
    /// Connects to `url` (`postgres://user@host:port/db`, libpq-style parameters; plus
    /// `schema=NAME` to keep the tables in that schema, created if missing), creating or
    /// migrating the tables. At most [`OpenOptions::pool_size`] connections are open at once.
    ///
    /// Errors: [`StoreError::UnsupportedUrl`] for a URL that does not parse,
    /// [`StoreError::NewerSchema`] for tables of a newer rethread, [`StoreError::Corrupt`]
    /// for a schema that holds foreign tables of the same names, [`StoreError::Backend`] when
    /// the server cannot be reached. No TLS: use it on loopback or a private network.
    pub async fn open(url: &str, options: OpenOptions) -> Result<Self, StoreError> {
        let label = crate::redact_url(url);
        let (pg_url, schema) = crate::open::postgres_parts(url)?;
        let mut config =
            tokio_postgres::Config::from_str(&pg_url).map_err(|e| StoreError::UnsupportedUrl {
                url: label.clone(),
                reason: e.to_string(),
            })?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(Duration::from_secs(10));
        }
        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(options.pool_size)
            .build()
            .map_err(|e| StoreError::Backend {
                backend: "postgres",
                source: Box::new(e),
            })?;
        let pg = Pg {
            pool,
            sql: Arc::new(Sql::new(schema)),
            label,
            relaxed: options.durability == Durability::Relaxed,
        };
        pg.migrate().await?;
        Ok(PostgresStore { store: Adapter(pg) })
    }

    /// The URL (without password) this store was opened with.
    pub fn url(&self) -> &str {
        &self.store.0.label
    }

    /// Closes the pool's connections.
    pub async fn close(self) {
        self.store.0.pool.close();
    }
}

impl Pg {
    fn map(&self, e: tokio_postgres::Error) -> StoreError {
        map_postgres_error(&self.label, e)
    }

    async fn client(&self) -> Result<deadpool_postgres::Client, StoreError> {
        self.pool
            .get()
            .await
            .map_err(|e| map_pool_error(&self.label, e))
    }
}

/// Whether a read needs more than one statement, hence a snapshot of its own.
fn needs_snapshot(needs: &Needs<'_>) -> bool {
    // A first page also reads the row ends.
    let statements = usize::from(needs.session.is_some())
        + usize::from(needs.rows.is_some())
        + usize::from(needs.lease)
        + usize::from(needs.page.is_some())
        + usize::from(matches!(needs.page, Some((None, _))));
    statements > 1
}

impl Backend for Pg {
    async fn read<O: ReadOp>(&self, op: O) -> Result<O::Output, StoreError> {
        let needs = op.needs();
        let mut client = self.client().await?;
        let mut view = if needs_snapshot(&needs) {
            let txn = client
                .build_transaction()
                .isolation_level(IsolationLevel::RepeatableRead)
                .read_only(true)
                .start()
                .await
                .map_err(|e| self.map(e))?;
            let view = self.fetch(&txn, &needs, None).await?;
            txn.commit().await.map_err(|e| self.map(e))?;
            view
        } else {
            self.fetch(&client, &needs, None).await?
        };
        op.run(&mut view)
    }

    /// Runs one write in its own transaction under the session's advisory lock: fetches what
    /// the rules need, applies them (`logic`), writes back.
    async fn write<O: WriteOp>(&self, op: O) -> Result<O::Output, StoreError> {
        let session_id = op.session_id();
        let mut client = self.client().await?;
        let txn = client.transaction().await.map_err(|e| self.map(e))?;
        let lock = txn
            .prepare_cached(&self.sql.lock)
            .await
            .map_err(|e| self.map(e))?;
        let synchronous_commit = if self.relaxed { "off" } else { "on" };
        let now: i64 = txn
            .query_one(
                &lock,
                &[&self.sql.lock_key(session_id), &synchronous_commit],
            )
            .await
            .map_err(|e| self.map(e))?
            .get(1);
        let mut view = self.fetch(&txn, &op.needs(), Some(session_id)).await?;
        let output = op.apply(&mut view, now)?;
        self.flush(&txn, view.writes).await?;
        txn.commit().await.map_err(|e| self.map(e))?;
        Ok(output)
    }
}
