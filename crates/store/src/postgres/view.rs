//! The buffered view `logic` runs on: what an operation needs, fetched under the session's
//! lock (writes) or in one snapshot (reads), plus the writes the rules made, flushed back in
//! the same transaction.

use std::collections::HashMap;
use std::ops::Range;

use deadpool_postgres::GenericClient;
use serde_json::Value;

use super::codec::{decode_record, encode, lease_from_row};
use super::Pg;
use crate::logic::{not_loaded, LeaseTxn, Needs, ReadTxn, WriteTxn};
use crate::{Lease, SessionRecord, StoreError, TranscriptRow};

/// One buffered write of [`Buffered`].
#[derive(Debug)]
pub(super) enum Write {
    Put(SessionRecord),
    Row(String, i64, String),
    Remove(String),
    Lease(Lease),
}

/// A page of records, and the `after` and limit it was fetched for.
#[derive(Debug)]
struct Page {
    after: Option<String>,
    limit: usize,
    records: Vec<SessionRecord>,
}

/// What was read for one operation, and the writes its rules made (applied to the view too,
/// so a later read in the same operation sees them). Reading anything that was not fetched is
/// an internal error: the operation's [`Needs`] did not say it.
#[derive(Debug)]
pub(super) struct Buffered<'a> {
    label: &'a str,
    records: HashMap<String, Option<SessionRecord>>,
    /// Whether rows exist, per session fetched.
    has_rows: HashMap<String, bool>,
    /// The row ends, fetched with a first page.
    row_ends: Option<Vec<(String, bool)>>,
    /// Rows fetched per session, and the range they cover.
    rows: HashMap<String, (Range<u64>, Vec<TranscriptRow>)>,
    leases: HashMap<String, Option<Lease>>,
    page: Option<Page>,
    pub(super) writes: Vec<Write>,
}

impl Pg {
    /// Fetches what `needs` says through `client` (a transaction when more than one statement
    /// runs). `lease_of` is the session whose lease is fetched if `needs.lease`.
    pub(super) async fn fetch<C: GenericClient>(
        &self,
        client: &C,
        needs: &Needs<'_>,
        lease_of: Option<&str>,
    ) -> Result<Buffered<'_>, StoreError> {
        let mut view = Buffered {
            label: &self.label,
            records: HashMap::new(),
            has_rows: HashMap::new(),
            row_ends: None,
            rows: HashMap::new(),
            leases: HashMap::new(),
            page: None,
            writes: Vec::new(),
        };
        if let Some(session_id) = needs.session {
            let stmt = client
                .prepare_cached(&self.sql.load)
                .await
                .map_err(|e| self.map(e))?;
            let row = client
                .query_one(&stmt, &[&session_id])
                .await
                .map_err(|e| self.map(e))?;
            let record = match row.get::<_, Option<String>>(0) {
                Some(_) => Some(decode_record(&self.label, &row)?),
                None => None,
            };
            view.has_rows
                .insert(session_id.to_string(), row.get::<_, bool>(9));
            if let (Some(range), Some(record)) = (&needs.rows, &record) {
                let range = range.start..range.end.min(record.row_count);
                let rows = self.load_rows(client, session_id, range.clone()).await?;
                view.rows.insert(session_id.to_string(), (range, rows));
            }
            view.records.insert(session_id.to_string(), record);
        }
        if let (true, Some(session_id)) = (needs.lease, lease_of) {
            let stmt = client
                .prepare_cached(&self.sql.load_lease)
                .await
                .map_err(|e| self.map(e))?;
            let lease = match client
                .query_opt(&stmt, &[&session_id])
                .await
                .map_err(|e| self.map(e))?
            {
                Some(row) => Some(lease_from_row(&self.label, session_id, &row)?),
                None => None,
            };
            view.leases.insert(session_id.to_string(), lease);
        }
        if let Some((after, limit)) = needs.page {
            let fetch = limit.min(i64::MAX as usize) as i64;
            let rows = match after {
                Some(after) => {
                    let stmt = client
                        .prepare_cached(&self.sql.list_after)
                        .await
                        .map_err(|e| self.map(e))?;
                    client.query(&stmt, &[&after, &fetch]).await
                }
                None => {
                    let stmt = client
                        .prepare_cached(&self.sql.list_all)
                        .await
                        .map_err(|e| self.map(e))?;
                    client.query(&stmt, &[&fetch]).await
                }
            }
            .map_err(|e| self.map(e))?;
            let records = rows
                .iter()
                .map(|r| decode_record(&self.label, r))
                .collect::<Result<Vec<_>, _>>()?;
            if after.is_none() {
                let stmt = client
                    .prepare_cached(&self.sql.row_ends)
                    .await
                    .map_err(|e| self.map(e))?;
                let ends = client
                    .query(&stmt, &[])
                    .await
                    .map_err(|e| self.map(e))?
                    .iter()
                    .map(|r| (r.get::<_, String>(0), r.get::<_, bool>(1)))
                    .collect::<Vec<_>>();
                view.row_ends = Some(ends);
            }
            view.page = Some(Page {
                after: after.map(str::to_string),
                limit,
                records,
            });
        }
        Ok(view)
    }

    pub(super) async fn flush(
        &self,
        txn: &deadpool_postgres::Transaction<'_>,
        writes: Vec<Write>,
    ) -> Result<(), StoreError> {
        let sql = &self.sql;
        let mut rows: Vec<(String, Vec<i64>, Vec<String>)> = Vec::new();
        let mut later = Vec::new();
        for write in writes {
            match write {
                Write::Row(session, seq, body) => match rows.last_mut() {
                    Some((s, seqs, bodies)) if *s == session => {
                        seqs.push(seq);
                        bodies.push(body);
                    }
                    _ => rows.push((session, vec![seq], vec![body])),
                },
                other => later.push(other),
            }
        }
        for (session, seqs, bodies) in rows {
            let stmt = txn
                .prepare_cached(&sql.put_rows)
                .await
                .map_err(|e| self.map(e))?;
            txn.execute(&stmt, &[&session, &seqs, &bodies])
                .await
                .map_err(|e| self.map(e))?;
        }
        for write in later {
            match write {
                Write::Row(..) => {}
                Write::Put(record) => {
                    let config = encode(&record.model_config)?;
                    let retired = encode(&record.retired_threads)?;
                    let binding = record.binding.as_ref();
                    let stmt = txn
                        .prepare_cached(&sql.put)
                        .await
                        .map_err(|e| self.map(e))?;
                    txn.execute(
                        &stmt,
                        &[
                            &record.session_id,
                            &config,
                            &binding.map(|b| b.thread_id.as_str()),
                            &binding.and_then(|b| b.codex_home.as_deref()),
                            &binding.map(|b| b.bound_at_ms),
                            &(record.row_count as i64),
                            &retired,
                            &record.created_at_ms,
                            &record.updated_at_ms,
                        ],
                    )
                    .await
                    .map_err(|e| self.map(e))?;
                }
                Write::Remove(session) => {
                    for text in [&sql.remove_rows, &sql.remove] {
                        let stmt = txn.prepare_cached(text).await.map_err(|e| self.map(e))?;
                        txn.execute(&stmt, &[&session])
                            .await
                            .map_err(|e| self.map(e))?;
                    }
                }
                Write::Lease(lease) => {
                    let stmt = txn
                        .prepare_cached(&sql.put_lease)
                        .await
                        .map_err(|e| self.map(e))?;
                    txn.execute(
                        &stmt,
                        &[
                            &lease.session_id,
                            &lease.owner.host,
                            &i64::from(lease.owner.pid),
                            &lease.owner.started_at_ms,
                            &(lease.owner.instance as i64),
                            &lease.acquired_at_ms,
                            &lease.expires_at_ms,
                            &(lease.fence as i64),
                            &lease.owner.process.as_ref().map(|p| p.space.as_str()),
                            &lease.owner.process.as_ref().map(|p| p.start_ticks as i64),
                        ],
                    )
                    .await
                    .map_err(|e| self.map(e))?;
                }
            }
        }
        Ok(())
    }

    pub(super) async fn load_rows<C: deadpool_postgres::GenericClient>(
        &self,
        client: &C,
        session_id: &str,
        range: Range<u64>,
    ) -> Result<Vec<TranscriptRow>, StoreError> {
        let start = range.start.min(i64::MAX as u64) as i64;
        let end = range.end.min(i64::MAX as u64) as i64;
        let stmt = client
            .prepare_cached(&self.sql.rows)
            .await
            .map_err(|e| self.map(e))?;
        let rows = client
            .query(&stmt, &[&session_id, &start, &end])
            .await
            .map_err(|e| self.map(e))?;
        rows.iter()
            .map(|r| {
                let seq: i64 = r.get(0);
                let body: String = r.get(1);
                let body = serde_json::from_str(&body).map_err(|e| StoreError::Corrupt {
                    path: self.label.clone(),
                    detail: format!("row {seq} of {session_id} does not decode"),
                    source: Some(Box::new(e)),
                })?;
                Ok(TranscriptRow {
                    seq: seq as u64,
                    body,
                })
            })
            .collect()
    }
}

fn covers(outer: &Range<u64>, inner: &Range<u64>) -> bool {
    inner.is_empty() || (outer.start <= inner.start && inner.end <= outer.end)
}

impl ReadTxn for Buffered<'_> {
    fn label(&self) -> &str {
        self.label
    }

    fn load(&mut self, session_id: &str) -> Result<Option<SessionRecord>, StoreError> {
        self.records
            .get(session_id)
            .cloned()
            .ok_or_else(|| not_loaded("the session record"))
    }

    fn load_rows(
        &mut self,
        session_id: &str,
        range: Range<u64>,
    ) -> Result<Vec<TranscriptRow>, StoreError> {
        match self.rows.get(session_id) {
            Some((fetched, rows)) if covers(fetched, &range) => Ok(rows
                .iter()
                .filter(|r| range.contains(&r.seq))
                .cloned()
                .collect()),
            _ => Err(not_loaded("the session's rows")),
        }
    }

    fn list(
        &mut self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<SessionRecord>, StoreError> {
        match &mut self.page {
            Some(page) if page.after.as_deref() == after && page.limit == limit => {
                Ok(std::mem::take(&mut page.records))
            }
            _ => Err(not_loaded("the page")),
        }
    }

    fn has_rows(&mut self, session_id: &str) -> Result<bool, StoreError> {
        self.has_rows
            .get(session_id)
            .copied()
            .ok_or_else(|| not_loaded("whether the session has rows"))
    }

    fn row_ends(&mut self) -> Result<Vec<(String, bool)>, StoreError> {
        let mut ends = self
            .row_ends
            .clone()
            .ok_or_else(|| not_loaded("the row ends"))?;
        ends.dedup();
        Ok(ends)
    }
}

impl WriteTxn for Buffered<'_> {
    fn put(&mut self, record: &SessionRecord) -> Result<(), StoreError> {
        self.records
            .insert(record.session_id.clone(), Some(record.clone()));
        self.writes.push(Write::Put(record.clone()));
        Ok(())
    }

    fn put_row(&mut self, session_id: &str, seq: u64, body: &Value) -> Result<(), StoreError> {
        self.writes.push(Write::Row(
            session_id.to_string(),
            seq as i64,
            body.to_string(),
        ));
        Ok(())
    }

    fn remove(&mut self, session_id: &str) -> Result<bool, StoreError> {
        let existed = self.load(session_id)?.is_some();
        self.records.insert(session_id.to_string(), None);
        self.writes.push(Write::Remove(session_id.to_string()));
        Ok(existed)
    }

    fn leases(&mut self) -> Option<&mut dyn LeaseTxn> {
        Some(self)
    }
}

impl LeaseTxn for Buffered<'_> {
    fn load_lease(&mut self, session_id: &str) -> Result<Option<Lease>, StoreError> {
        self.leases
            .get(session_id)
            .cloned()
            .ok_or_else(|| not_loaded("the session's lease"))
    }

    fn put_lease(&mut self, lease: &Lease) -> Result<(), StoreError> {
        self.leases
            .insert(lease.session_id.clone(), Some(lease.clone()));
        self.writes.push(Write::Lease(lease.clone()));
        Ok(())
    }
}
