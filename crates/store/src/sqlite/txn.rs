//! The SQL layer's connection on SQLite: a live transaction of a rusqlite connection, its
//! statements rendered once and cached by the connection.

use std::sync::LazyLock;

use rusqlite::types::ValueRef;
use rusqlite::{Connection, Row, ToSql};

use super::SqliteResult;
use crate::sql::{render, Dialect, Param, SqlConn, SqlRow, SqlTxn, Stmt, SQLITE};
use crate::{Result, StoreError};

/// The statements in SQLite's dialect.
static STATEMENTS: LazyLock<Vec<String>> = LazyLock::new(|| render(&SQLITE, ""));

/// A transaction's view of a connection (the caller began and will end the transaction).
pub(super) type Txn<'c> = SqlTxn<'c, Sqlite<'c>>;

/// The view of a transaction on `conn`.
pub(super) fn view<'c>(conn: &'c Connection, label: &'c str) -> Txn<'c> {
    SqlTxn::new(Sqlite { conn, label }, label)
}

/// A connection in a transaction.
pub(super) struct Sqlite<'c> {
    conn: &'c Connection,
    label: &'c str,
}

/// The values of `params` as rusqlite binds them.
fn bind<'p>(params: &'p [Param<'_>]) -> Result<Vec<&'p dyn ToSql>> {
    let value = |param: &'p Param<'_>| -> Result<&'p dyn ToSql> {
        Ok(match param {
            Param::Int(v) => v,
            Param::OptInt(v) => v,
            Param::Text(v) => v,
            Param::OptText(v) => v,
            Param::Bytes(v) => v,
            Param::Ints(_) | Param::Texts(_) => {
                return Err(StoreError::Internal("SQLite binds no arrays".into()))
            }
        })
    };
    params.iter().map(value).collect()
}

impl SqlConn for Sqlite<'_> {
    const DIALECT: &'static Dialect = &SQLITE;

    fn execute(&mut self, statement: Stmt, params: &[Param<'_>]) -> Result<u64> {
        let sql = &STATEMENTS[statement as usize];
        let mut statement = self.conn.prepare_cached(sql).sqlite(self.label)?;
        let changed = statement.execute(bind(params)?.as_slice());
        Ok(changed.sqlite(self.label)? as u64)
    }

    fn query(
        &mut self,
        statement: Stmt,
        params: &[Param<'_>],
        each: &mut dyn FnMut(&dyn SqlRow) -> Result<()>,
    ) -> Result<()> {
        let label = self.label;
        let sql = &STATEMENTS[statement as usize];
        let mut statement = self.conn.prepare_cached(sql).sqlite(label)?;
        let mut rows = statement.query(bind(params)?.as_slice()).sqlite(label)?;
        while let Some(row) = rows.next().sqlite(label)? {
            each(&SqliteRow { row, label })?;
        }
        Ok(())
    }

    /// The free pages before this commit's step of the upkeep (the engine's `maintain`, which
    /// gives back at most [`super::VACUUM_STEP_PAGES`] of them). A store without
    /// `auto_vacuum = INCREMENTAL` gives none back: 0.
    fn free_pages(&mut self) -> Result<u64> {
        let pragma = |name: &str| {
            let sql = format!("PRAGMA {name}");
            self.conn
                .query_row(&sql, [], |r| r.get::<_, i64>(0))
                .sqlite(self.label)
        };
        if pragma("auto_vacuum")? != 2 {
            return Ok(0);
        }
        Ok(u64::try_from(pragma("freelist_count")?).unwrap_or(0))
    }
}

/// A row as the SQL layer reads it.
pub(super) struct SqliteRow<'r, 's> {
    pub(super) row: &'r Row<'s>,
    pub(super) label: &'r str,
}

impl SqliteRow<'_, '_> {
    fn value(&self, at: usize) -> Result<ValueRef<'_>> {
        self.row.get_ref(at).sqlite(self.label)
    }
}

impl SqlRow for SqliteRow<'_, '_> {
    fn int(&self, at: usize) -> Result<i64> {
        self.row.get(at).sqlite(self.label)
    }

    fn opt_int(&self, at: usize) -> Result<Option<i64>> {
        self.row.get(at).sqlite(self.label)
    }

    fn str(&self, at: usize) -> Result<&str> {
        let text = self.value(at)?.as_str();
        text.map_err(rusqlite::Error::from).sqlite(self.label)
    }

    fn opt_str(&self, at: usize) -> Result<Option<&str>> {
        let text = self.value(at)?.as_str_or_null();
        text.map_err(rusqlite::Error::from).sqlite(self.label)
    }

    fn bytes(&self, at: usize) -> Result<&[u8]> {
        let bytes = self.value(at)?.as_blob();
        bytes.map_err(rusqlite::Error::from).sqlite(self.label)
    }

    fn flag(&self, at: usize) -> Result<bool> {
        self.row.get(at).sqlite(self.label)
    }
}
