//! A view that lets an operation read only what its [`Needs`] declare.
//!
//! A backend that fetches before it runs the rules (PostgreSQL) trusts each operation's
//! `needs()`; an operation that reads more fails there with `Internal`. The memory backend runs
//! every operation through this view, so the conformance suite checks the declarations on
//! every run, with no server.

use std::ops::Range;

use super::{not_loaded, LeaseTxn, Needs, ReadTxn, WriteTxn};
use crate::{Lease, SessionRecord, StoreError, TranscriptRow};

/// `inner` as an operation that declared `needs` may see it.
pub(crate) struct Declared<'a, T: ?Sized> {
    inner: &'a mut T,
    needs: Needs<'a>,
    /// The session whose lease a write may read (its own).
    lease_of: Option<&'a str>,
}

impl<'a, T: ?Sized> Declared<'a, T> {
    pub(crate) fn new(inner: &'a mut T, needs: Needs<'a>, lease_of: Option<&'a str>) -> Self {
        Declared {
            inner,
            needs,
            lease_of,
        }
    }

    fn declared_session(&self, session_id: &str) -> Result<(), StoreError> {
        match self.needs.session {
            Some(declared) if declared == session_id => Ok(()),
            _ => Err(not_loaded("an undeclared session record")),
        }
    }
}

fn covers(outer: &Range<u64>, inner: &Range<u64>) -> bool {
    inner.is_empty() || (outer.start <= inner.start && inner.end <= outer.end)
}

impl<T: ReadTxn + ?Sized> ReadTxn for Declared<'_, T> {
    fn label(&self) -> &str {
        self.inner.label()
    }

    fn load(&mut self, session_id: &str) -> Result<Option<SessionRecord>, StoreError> {
        self.declared_session(session_id)?;
        self.inner.load(session_id)
    }

    fn load_rows(
        &mut self,
        session_id: &str,
        range: Range<u64>,
    ) -> Result<Vec<TranscriptRow>, StoreError> {
        self.declared_session(session_id)?;
        match &self.needs.rows {
            Some(declared) if covers(declared, &range) => self.inner.load_rows(session_id, range),
            _ => Err(not_loaded("undeclared rows")),
        }
    }

    fn list(
        &mut self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<SessionRecord>, StoreError> {
        if self.needs.page != Some((after, limit)) {
            return Err(not_loaded("an undeclared page"));
        }
        self.inner.list(after, limit)
    }

    fn has_rows(&mut self, session_id: &str) -> Result<bool, StoreError> {
        // Fetched with the session's record.
        self.declared_session(session_id)?;
        self.inner.has_rows(session_id)
    }

    fn row_ends(&mut self) -> Result<Vec<(String, bool)>, StoreError> {
        // Fetched with the first page.
        if !matches!(self.needs.page, Some((None, _))) {
            return Err(not_loaded("the row ends (only the first page has them)"));
        }
        self.inner.row_ends()
    }
}

impl<T: WriteTxn + ?Sized> WriteTxn for Declared<'_, T> {
    fn put(&mut self, record: &SessionRecord) -> Result<(), StoreError> {
        self.inner.put(record)
    }

    fn put_row(
        &mut self,
        session_id: &str,
        seq: u64,
        body: &serde_json::Value,
    ) -> Result<(), StoreError> {
        self.inner.put_row(session_id, seq, body)
    }

    fn remove(&mut self, session_id: &str) -> Result<bool, StoreError> {
        // Removing tells whether the record existed: a read of it.
        self.declared_session(session_id)?;
        self.inner.remove(session_id)
    }

    fn leases(&mut self) -> Option<&mut dyn LeaseTxn> {
        if !self.needs.lease {
            return None;
        }
        Some(self)
    }
}

impl<T: WriteTxn + ?Sized> LeaseTxn for Declared<'_, T> {
    fn load_lease(&mut self, session_id: &str) -> Result<Option<Lease>, StoreError> {
        if self.lease_of != Some(session_id) {
            return Err(not_loaded("an undeclared lease"));
        }
        let leases = self
            .inner
            .leases()
            .ok_or_else(|| not_loaded("the leases"))?;
        leases.load_lease(session_id)
    }

    fn put_lease(&mut self, lease: &Lease) -> Result<(), StoreError> {
        let leases = self
            .inner
            .leases()
            .ok_or_else(|| not_loaded("the leases"))?;
        leases.put_lease(lease)
    }
}
