//! Store URLs as they may be shown: never with a password.

/// `url` with any password replaced by `***`: the userinfo password
/// (`postgres://alice:***@host/db`) and a `password` query parameter. Everything else is kept,
/// so the URL still says which store is meant. Used for every message that names a store URL.
///
/// ```
/// use rethread_store::redact_url;
/// assert_eq!(redact_url("postgres://alice:s3cret@db:5432/app"), "postgres://alice:***@db:5432/app");
/// assert_eq!(redact_url("postgres://db/app?user=a&password=s3cret"), "postgres://db/app?user=a&password=***");
/// assert_eq!(redact_url("sqlite:/var/lib/rethread.db"), "sqlite:/var/lib/rethread.db");
/// ```
pub fn redact_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) => {
            if parsed.password().is_some() {
                // Fails only for URLs that cannot have a password, which this one has.
                let _ = parsed.set_password(Some("***"));
            }
            let has_secret = parsed
                .query_pairs()
                .any(|(key, _)| key.eq_ignore_ascii_case("password"));
            if has_secret {
                let pairs: Vec<(String, String)> = parsed
                    .query_pairs()
                    .map(|(key, value)| {
                        let value = if key.eq_ignore_ascii_case("password") {
                            "***".to_string()
                        } else {
                            value.into_owned()
                        };
                        (key.into_owned(), value)
                    })
                    .collect();
                parsed.query_pairs_mut().clear().extend_pairs(pairs);
            }
            // The query serializer escapes `*`; keep the mask readable.
            parsed.to_string().replace("%2A%2A%2A", "***")
        }
        // Not a URL the parser takes: keep only what precedes any userinfo, to be safe.
        Err(_) => match url.split_once("://") {
            Some((scheme, rest)) => match rest.rsplit_once('@') {
                Some((userinfo, host)) => {
                    let user = userinfo.split(':').next().unwrap_or("");
                    format!("{scheme}://{user}:***@{host}")
                }
                None => url.to_string(),
            },
            None => url.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn passwords_never_survive() {
        for (url, secret) in [
            ("postgres://alice:PASSWORD@host/db", "PASSWORD"),
            ("postgresql://alice:p%40ss@host:5433/db?schema=x", "p%40ss"),
            ("postgres://host/db?password=hunter2&user=bob", "hunter2"),
            ("postgres://alice:PASSWORD@", "PASSWORD"),
            ("postgres://alice:pa ss@bad host/db", "pa ss"),
        ] {
            let shown = redact_url(url);
            assert!(!shown.contains(secret), "{url} -> {shown}");
        }
    }

    #[test]
    fn everything_else_is_kept() {
        assert_eq!(
            redact_url("postgres://alice:pw@host:5433/db?schema=s1"),
            "postgres://alice:***@host:5433/db?schema=s1"
        );
        assert_eq!(
            redact_url("postgres://alice@host/db"),
            "postgres://alice@host/db"
        );
        assert_eq!(redact_url("redb:/tmp/x.redb"), "redb:/tmp/x.redb");
        assert_eq!(redact_url("memory:"), "memory:");
    }
}
