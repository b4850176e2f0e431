//! The conformance suite every [`BindingStore`] backend runs (feature `conformance`).
//!
//! Each scenario is a `pub async fn scenario(store: &BindingStore)` that panics on a
//! violation; those about time also take the store's [`Clock`], a manual one they advance
//! instead of sleeping. Scenarios pick fresh session ids on every call, so they can share one
//! store and run in any order, any number of times. A backend test opens its store on a
//! [`Clock::manual`] over its engine and runs [`run_all`] on it (rethread's own tests run it
//! again through an engine that wraps the backend's, as testkit's fault injection does):
//!
//! ```no_run
//! # async fn demo() {
//! use rethread_store::{conformance, BindingStore, Clock};
//! let clock = Clock::manual();
//! let store = BindingStore::memory_with_clock(clock.clone());
//! conformance::run_all(&store, &clock).await;
//! # }
//! ```

mod bindings;
mod leases;
mod mirror;
mod mirror_format;
mod model;
mod retention;
mod sessions;
mod state;
mod threads;

use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{Map, Value};

use crate::{BindingStore, Clock, Retirement, TurnCommit};

pub use bindings::{
    commit_publishes_binding, concurrent_patches_of_distinct_keys, many_sessions_commit_at_once,
    merge_patch_semantics, refused_write_does_not_fail_its_neighbours,
    retired_thread_is_never_published, row_order,
};
pub use leases::{
    concurrent_acquires_grant_one, delete_is_refused_while_the_lease_is_live,
    dropped_local_holder_is_taken_over_at_once, fenced_writes_need_the_newest_grant,
    import_is_refused_while_the_lease_is_live, lease_expiry_frees_a_crashed_holder,
    lease_is_exclusive, lease_owner_mismatch_cannot_renew_or_release, lease_release_frees,
    lease_renew_extends, stall_past_the_ttl_with_nobody_competing_goes_on,
};
pub use mirror::{
    mirror_appends_with_the_turn, mirror_is_dropped_when_stale_or_retired,
    mirror_merges_its_newest_chunks, mirror_of_a_refused_commit_is_not_written,
    mirror_refuses_an_append_that_does_not_extend,
    mirror_starts_again_for_the_thread_replacing_a_capped_one, mirror_stops_past_the_cap,
    mirror_travels_with_the_session,
};
pub use mirror_format::{
    mirror_chunk_that_does_not_decode_is_corrupt, mirror_keeps_a_share_of_a_realistic_rollout,
    mirror_reads_raw_chunks_written_before_compression, stored_mirror_bytes,
};
pub use model::{op_strategy, random_ops_match_model, Op};
pub use retention::{
    prune_removes_idle_sessions_only, prune_removes_stale_lease_records_without_a_session,
};
pub use sessions::{
    copy_sessions_roundtrip, delete_session, export_import_roundtrip, invalid_input,
    list_sessions_pages, verify_finds_nothing_on_a_healthy_store,
};
pub use state::{
    ended_unbinds_without_a_notice, give_up_is_compare_and_set, give_up_then_a_new_thread_binds,
    notice_delivered_is_recorded, refused_give_up_writes_nothing, the_published_view_is_the_stores,
};
pub use threads::{
    a_thread_belongs_to_one_session, exports_carry_the_threads_used_before,
    imports_claim_their_threads,
};

static NEXT: AtomicU64 = AtomicU64::new(0);

/// A session id no other scenario call uses: `{name}-{process id}-{counter}`.
pub fn unique_id(name: &str) -> String {
    format!(
        "{name}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Thread `name` of session `session`: a thread belongs to one session, so scenarios that
/// share a store name their threads per session.
pub(crate) fn th(session: &str, name: &str) -> String {
    format!("{session}/{name}")
}

/// A give-up's retirement.
pub(crate) fn lost(reason: &str, message: &str) -> Retirement {
    Retirement::Lost {
        reason: reason.to_string(),
        message: message.to_string(),
    }
}

pub(crate) fn turn(session: &str, thread: &str, rows: Vec<Value>) -> TurnCommit {
    TurnCommit {
        session_id: session.to_string(),
        thread_id: thread.to_string(),
        codex_home: Some(format!("/codex-home/{thread}")),
        rows,
        fence: None,
        mirror: None,
    }
}

pub(crate) fn obj(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        other => panic!("not an object: {other}"),
    }
}

/// Runs every scenario, in order, on `store`.
pub async fn run_all(store: &BindingStore, clock: &Clock) {
    commit_publishes_binding(store).await;
    merge_patch_semantics(store).await;
    retired_thread_is_never_published(store).await;
    give_up_then_a_new_thread_binds(store).await;
    give_up_is_compare_and_set(store).await;
    ended_unbinds_without_a_notice(store).await;
    notice_delivered_is_recorded(store).await;
    refused_give_up_writes_nothing(store).await;
    the_published_view_is_the_stores(store).await;
    a_thread_belongs_to_one_session(store).await;
    imports_claim_their_threads(store).await;
    exports_carry_the_threads_used_before(store).await;
    row_order(store).await;
    concurrent_patches_of_distinct_keys(store).await;
    many_sessions_commit_at_once(store).await;
    refused_write_does_not_fail_its_neighbours(store).await;
    list_sessions_pages(store).await;
    delete_session(store).await;
    export_import_roundtrip(store).await;
    copy_sessions_roundtrip(store).await;
    verify_finds_nothing_on_a_healthy_store(store).await;
    invalid_input(store).await;
    run_mirror(store).await;
    random_ops_match_model(store).await;
    run_leases(store, clock).await;
    prune_removes_idle_sessions_only(store, clock).await;
    prune_removes_stale_lease_records_without_a_session(store, clock).await;
}

/// Runs every mirror scenario, in order, on `store`.
pub async fn run_mirror(store: &BindingStore) {
    mirror_appends_with_the_turn(store).await;
    mirror_refuses_an_append_that_does_not_extend(store).await;
    mirror_stops_past_the_cap(store).await;
    mirror_starts_again_for_the_thread_replacing_a_capped_one(store).await;
    mirror_is_dropped_when_stale_or_retired(store).await;
    mirror_of_a_refused_commit_is_not_written(store).await;
    mirror_travels_with_the_session(store).await;
    mirror_merges_its_newest_chunks(store).await;
    // Written below the store, as an older rethread wrote them: never in a sealed store.
    if !store.is_sealed() {
        mirror_reads_raw_chunks_written_before_compression(store).await;
        mirror_chunk_that_does_not_decode_is_corrupt(store).await;
    }
}

/// Runs every lease scenario, in order, on `store`.
pub async fn run_leases(store: &BindingStore, clock: &Clock) {
    lease_is_exclusive(store).await;
    lease_release_frees(store).await;
    lease_renew_extends(store, clock).await;
    lease_expiry_frees_a_crashed_holder(store, clock).await;
    lease_owner_mismatch_cannot_renew_or_release(store).await;
    concurrent_acquires_grant_one(store).await;
    fenced_writes_need_the_newest_grant(store, clock).await;
    stall_past_the_ttl_with_nobody_competing_goes_on(store, clock).await;
    delete_is_refused_while_the_lease_is_live(store, clock).await;
    import_is_refused_while_the_lease_is_live(store, clock).await;
    dropped_local_holder_is_taken_over_at_once(store).await;
}
