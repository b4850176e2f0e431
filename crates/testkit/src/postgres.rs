//! The test PostgreSQL server, keyed on `RETHREAD_TEST_POSTGRES_URL` (`.ci/run` starts one
//! and sets it; `source .ci/postgres.sh && rethread_start_postgres` does the same by hand).

/// A URL to a fresh schema of the test database, named after `test`; `None` (the test skips,
/// saying so) when `RETHREAD_TEST_POSTGRES_URL` is unset. Under `CI=true` or
/// `RETHREAD_REQUIRE_POSTGRES=1` an unset URL fails the test instead: CI never skips them.
pub fn fresh_url(test: &str) -> Option<String> {
    let base = server_url(test)?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let schema = format!("t_{test}_{}_{nanos}", std::process::id());
    let sep = if base.contains('?') { '&' } else { '?' };
    Some(format!("{base}{sep}schema={schema}"))
}

/// The test server's URL itself (for a test that changes its role or database), with
/// [`fresh_url`]'s rules for an unset one.
pub fn server_url(test: &str) -> Option<String> {
    let Ok(base) = std::env::var("RETHREAD_TEST_POSTGRES_URL") else {
        let required = std::env::var("CI").is_ok_and(|v| v == "true")
            || std::env::var("RETHREAD_REQUIRE_POSTGRES").is_ok_and(|v| v == "1");
        assert!(
            !required,
            "RETHREAD_TEST_POSTGRES_URL is not set but PostgreSQL tests are required \
             (CI=true or RETHREAD_REQUIRE_POSTGRES=1); `.ci/run` starts a server"
        );
        eprintln!(
            "skipping {test}: RETHREAD_TEST_POSTGRES_URL is not set \
             (run `source .ci/postgres.sh && rethread_start_postgres` first)"
        );
        return None;
    };
    Some(base)
}
