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
    // The file backends' paths hold no secret and may hold `:` and `@`: shown as they are.
    if ["redb:", "sqlite:", "memory:"]
        .iter()
        .any(|scheme| url.starts_with(scheme))
    {
        return url.to_string();
    }
    // Not parsed, so that what the parser reads another way (a path for `postgres:/a:b@h`,
    // a fragment after a `#` in a password) or refuses is masked all the same.
    mask_password_values(&mask_userinfo(url))
}

/// Masks what lies between the userinfo's first `:` and the last `@`, after the scheme.
fn mask_userinfo(url: &str) -> String {
    let start = match url.find("://") {
        Some(at) => at + 3,
        None => url
            .find(':')
            .filter(|&at| {
                let scheme = &url[..at];
                !scheme.is_empty()
                    && scheme
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "+.-".contains(c))
            })
            .map_or(0, |at| at + 1),
    };
    let Some(at) = url[start..].rfind('@').map(|at| start + at) else {
        return url.to_string();
    };
    match url[start..at].find(':') {
        Some(colon) => format!("{}:***{}", &url[..start + colon], &url[at..]),
        None => url.to_string(),
    }
}

/// Masks the value of every `password=` (a query parameter, or libpq's `key=value` form,
/// quoted or not), whatever its case.
fn mask_password_values(text: &str) -> String {
    const KEY: &str = "password=";
    let lower = text.to_ascii_lowercase();
    let mut out = String::with_capacity(text.len());
    let mut from = 0;
    while let Some(found) = lower[from..].find(KEY) {
        let value = from + found + KEY.len();
        out.push_str(&text[from..value]);
        out.push_str("***");
        let rest = &text[value..];
        let len = match rest.strip_prefix('\'') {
            Some(quoted) => quoted.find('\'').map_or(rest.len(), |end| end + 2),
            None => rest
                .find(|c: char| c == '&' || c == '#' || c.is_whitespace())
                .unwrap_or(rest.len()),
        };
        from = value + len;
    }
    out.push_str(&text[from..]);
    out
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
            // Typos the parser reads as a path or refuses, and a `#` read as a fragment.
            ("postgres:/alice:hunter2@db/x", "hunter2"),
            ("postgres//alice:hunter2@db/x", "hunter2"),
            ("postgres://alice:123#hunter2@db/x", "hunter2"),
            ("postgres://alice:p@ss@host/db", "p@ss"),
            // libpq's key=value form, which the store does not take but names in its error.
            (
                "host=db user=rethread password=hunter2 dbname=rethread",
                "hunter2",
            ),
            ("host=db password='hunter 2' dbname=x", "hunter 2"),
            (
                "postgres://db/x?sslmode=require&PASSWORD=hunter2",
                "hunter2",
            ),
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
