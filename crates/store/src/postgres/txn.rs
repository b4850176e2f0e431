//! The SQL layer's connection on PostgreSQL: a live transaction of a blocking `postgres`
//! client (on the store's pool threads) and that connection's prepared statements.

use postgres::fallible_iterator::FallibleIterator;
use postgres::types::{FromSql, ToSql};
use postgres::{Row, Transaction};

use super::error::PgResult;
use super::sql::Statements;
use crate::sql::{Dialect, Param, SqlConn, SqlRow, SqlTxn, Stmt, POSTGRES};
use crate::Result;

/// A transaction's view of a connection (the caller began and will end the transaction).
pub(super) fn view<'a, 't>(
    txn: &'a mut Transaction<'t>,
    sql: &'a Statements,
    label: &'a str,
) -> SqlTxn<'a, Pg<'a, 't>> {
    SqlTxn::new(Pg { txn, sql, label }, label)
}

/// A transaction on a connection and that connection's statements.
pub(super) struct Pg<'a, 't> {
    txn: &'a mut Transaction<'t>,
    sql: &'a Statements,
    label: &'a str,
}

/// The values of `params` as the driver binds them.
fn bind<'p>(params: &'p [Param<'_>]) -> Vec<&'p (dyn ToSql + Sync)> {
    let value = |param: &'p Param<'_>| -> &'p (dyn ToSql + Sync) {
        match param {
            Param::Int(v) => v,
            Param::OptInt(v) => v,
            Param::Text(v) => v,
            Param::OptText(v) => v,
            Param::Bytes(v) => v,
            Param::Ints(v) => v,
            Param::Texts(v) => v,
        }
    };
    params.iter().map(value).collect()
}

impl SqlConn for Pg<'_, '_> {
    const DIALECT: &'static Dialect = &POSTGRES;

    fn execute(&mut self, statement: Stmt, params: &[Param<'_>]) -> Result<u64> {
        let statement = &self.sql.all[statement as usize];
        self.txn.execute(statement, &bind(params)).pg(self.label)
    }

    fn query(
        &mut self,
        statement: Stmt,
        params: &[Param<'_>],
        each: &mut dyn FnMut(&dyn SqlRow) -> Result<()>,
    ) -> Result<()> {
        let statement = &self.sql.all[statement as usize];
        // Row by row as the server sends them.
        let rows = self.txn.query_raw(statement, bind(params));
        let mut rows = rows.pg(self.label)?;
        while let Some(row) = rows.next().pg(self.label)? {
            each(&PgRow {
                row: &row,
                label: self.label,
            })?;
        }
        Ok(())
    }
}

/// A row as the SQL layer reads it.
struct PgRow<'r> {
    row: &'r Row,
    label: &'r str,
}

impl PgRow<'_> {
    fn get<'v, T: FromSql<'v>>(&'v self, at: usize) -> Result<T> {
        self.row.try_get(at).pg(self.label)
    }
}

impl SqlRow for PgRow<'_> {
    fn int(&self, at: usize) -> Result<i64> {
        self.get(at)
    }

    fn opt_int(&self, at: usize) -> Result<Option<i64>> {
        self.get(at)
    }

    fn str(&self, at: usize) -> Result<&str> {
        self.get(at)
    }

    fn opt_str(&self, at: usize) -> Result<Option<&str>> {
        self.get(at)
    }

    fn bytes(&self, at: usize) -> Result<&[u8]> {
        self.get(at)
    }

    fn flag(&self, at: usize) -> Result<bool> {
        self.get(at)
    }
}
