//! Store URLs as they may be shown: never with a password.

use std::ops::Range;

/// `url` with every password it may hold replaced by `***`, whatever its scheme (`postgres:`,
/// `sqlite:`, `redb:`, or one the store refuses: a password typed into any URL is a secret):
/// the userinfo password (`postgres://alice:***@host/db`, `redb://alice:***@host/x`) and the
/// value of every parameter whose name, as the PostgreSQL driver reads it (percent-decoded,
/// tabs and newlines dropped as the URL parser drops them, any case), contains `password`
/// (`password`, `sslpassword`, `pass%77ord`). A value is masked up to the next `&` (in
/// libpq's `key=value` form, to its end as the driver reads it). Kept: everything else,
/// `passfile` (a path) and `options` (server settings, not credentials) among it, so the URL
/// still says which store is meant (a file path holding `:...@` or `?password=` is masked
/// too: rather a name shown in part than a password shown). Used for every message and log
/// line that names a store URL.
///
/// ```
/// use rethread_store::redact_url;
/// assert_eq!(redact_url("postgres://alice:s3cret@db:5432/app"), "postgres://alice:***@db:5432/app");
/// assert_eq!(redact_url("postgres://db/app?user=a&pass%77ord=s3cret"), "postgres://db/app?user=a&pass%77ord=***");
/// assert_eq!(redact_url("redb://alice:s3cret@host/x.redb"), "redb://alice:***@host/x.redb");
/// assert_eq!(redact_url("sqlite:///x.db?password=s3cret"), "sqlite:///x.db?password=***");
/// assert_eq!(redact_url("sqlite:/var/lib/rethread.db"), "sqlite:/var/lib/rethread.db");
/// ```
pub fn redact_url(url: &str) -> String {
    // Not parsed, so that what the parser reads another way (a path for `postgres:/a:b@h`,
    // a fragment after a `#` in a password) or refuses is masked all the same. Each rule
    // finds its ranges in the URL as given; where they overlap, one `***` covers both.
    let start = authority_start(url);
    let mut secrets: Vec<Range<usize>> = userinfo_password(url, start.unwrap_or(0))
        .into_iter()
        .chain(parameter_values(url, start.is_some()))
        .collect();
    secrets.sort_by_key(|range| range.start);
    let (mut shown, mut at) = (String::with_capacity(url.len()), 0);
    for range in secrets {
        if range.start >= at {
            shown.push_str(&url[at..range.start]);
            shown.push_str("***");
        }
        at = at.max(range.end);
    }
    shown.push_str(&url[at..]);
    shown
}

/// How errors and logs name a store file: its path, masked by [`redact_url`]'s rule as the
/// path of a `sqlite:PATH` URL is (a path holding `:...@` or `?password=` may be a URL's
/// password typed into the verbatim form: shown masked in the URL, it is masked here too).
#[cfg(any(feature = "redb", feature = "sqlite"))]
pub(crate) fn path_label(path: &std::path::Path) -> String {
    const SCHEME: &str = "sqlite:";
    let shown = redact_url(&format!("{SCHEME}{}", path.display()));
    shown[SCHEME.len()..].to_string()
}

/// Where the userinfo would start: after `scheme://`, or after a `scheme:`; `None` when
/// `url` names no scheme (libpq's `key=value` form).
fn authority_start(url: &str) -> Option<usize> {
    if let Some(at) = url.find("://") {
        return Some(at + 3);
    }
    let at = url.find(':')?;
    let scheme = &url[..at];
    let is_scheme = !scheme.is_empty()
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "+.-".contains(c));
    is_scheme.then_some(at + 1)
}

/// What lies between the userinfo's first `:` and the last `@`, from `start`.
fn userinfo_password(url: &str, start: usize) -> Option<Range<usize>> {
    let at = start + url[start..].rfind('@')?;
    let colon = start + url[start..at].find(':')?;
    Some(colon + 1..at)
}

/// The value of every `name=value` whose name names a password. In a URL (`in_url`) a name
/// follows a `?` or `&` and its value runs to the next `&`, as the driver reads a query;
/// otherwise (libpq's form) names and values are separated by whitespace, a value quoted or
/// with `\` escapes.
fn parameter_values(text: &str, in_url: bool) -> Vec<Range<usize>> {
    let separates = |c: char| match in_url {
        true => c == '?' || c == '&',
        false => c.is_whitespace(),
    };
    let (mut values, mut from) = (Vec::new(), 0);
    while let Some(eq) = text[from..].find('=').map(|at| from + at) {
        let before = if in_url {
            &text[from..eq]
        } else {
            text[from..eq].trim_end()
        };
        let name = before.rsplit(separates).next().unwrap_or(before);
        from = eq + 1;
        if names_a_password(name) {
            let rest = &text[from..];
            let len = match in_url {
                true => rest.find('&').unwrap_or(rest.len()),
                false => libpq_value_len(rest),
            };
            values.push(from..from + len);
            from += len;
        }
    }
    values
}

/// Whether a parameter name, read as the driver reads it, names a password.
fn names_a_password(name: &str) -> bool {
    let name: String = name.chars().filter(|c| !"\t\n\r".contains(*c)).collect();
    percent_encoding::percent_decode_str(&name)
        .decode_utf8_lossy()
        .to_lowercase()
        .contains("password")
}

/// The length of the libpq-form value at the start of `text` (leading whitespace included):
/// quoted (`'...'`) or up to whitespace, `\` escaping the next character either way.
fn libpq_value_len(text: &str) -> usize {
    let start = text.len() - text.trim_start().len();
    let quoted = text[start..].starts_with('\'');
    let mut chars = text[start..].char_indices().skip(usize::from(quoted));
    while let Some((at, c)) = chars.next() {
        match c {
            '\\' => {
                chars.next();
            }
            '\'' if quoted => return start + at + 1,
            c if !quoted && c.is_whitespace() => return start + at,
            _ => {}
        }
    }
    text.len()
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

    /// The password the driver logs in with, read as the store reads a URL (its own
    /// parameters taken out, then the driver's parser).
    fn driver_password(url: &str) -> Option<String> {
        let (url, _) = crate::open::postgres_parts(url).ok()?;
        let config: tokio_postgres::Config = url.parse().ok()?;
        Some(String::from_utf8_lossy(config.get_password()?).into_owned())
    }

    #[test]
    fn a_password_is_masked_however_the_driver_reads_it() {
        for url in [
            // Parameter names are percent-decoded by the driver.
            "postgres://alice@db/x?pass%77ord=S3CR3T",
            "postgres://alice@db/x?%70assword=S3CR3T",
            "postgres://alice@db/x?sslmode=disable&%70%61%73%73%77%6F%72%64=S3CR3T",
            // The URL parser drops tabs and newlines anywhere.
            "postgres://alice@db/x?pass\tword=S3CR3T",
            "postgres://alice@db/x?pass\nword=S3CR3T",
            // A value runs to the next `&`: a `#`, a space or a `?` are the password's.
            "postgres://alice@db/x?password=ab#S3CR3T",
            "postgres://alice@db/x?password=ab S3CR3T&user=bob",
            "postgres://alice@db/x?password=ab?S3CR3T",
        ] {
            assert!(
                driver_password(url).is_some_and(|p| p.contains("S3CR3T")),
                "the driver reads no such password from {url}"
            );
            let shown = redact_url(url);
            assert!(!shown.contains("S3CR3T"), "{url} -> {shown}");
        }
        // Secrets the driver refuses to read are masked all the same (the error names the URL).
        for url in [
            "postgres://alice@db/x?sslpassword=S3CR3T",
            "postgres://alice@db/x?x%26password=S3CR3T",
            "host=db password = S3CR3T dbname=x",
            "host=db password=ab\\ S3CR3T dbname=x",
            "host=db password='ab\\' S3CR3T' dbname=x",
        ] {
            let shown = redact_url(url);
            assert!(!shown.contains("S3CR3T"), "{url} -> {shown}");
        }
        // What names no password is kept, `passfile` (a path) and `options` among it.
        assert_eq!(
            redact_url("postgres://db/x?passfile=/p&options=-c%20a%3Db&pass%77ord=1&user=u"),
            "postgres://db/x?passfile=/p&options=-c%20a%3Db&pass%77ord=***&user=u"
        );
        assert_eq!(
            redact_url("host=db password='a b' dbname=x"),
            "host=db password=*** dbname=x"
        );
    }

    proptest::proptest! {
        // Cheap (microseconds a case), and most cases are URLs the driver refuses.
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(4096))]
        /// Whatever spelling a URL's parameters take, no password the driver reads is shown.
        /// `S3CR3T` is only ever in a password: a URL the driver reads may not show it.
        #[test]
        fn no_password_the_driver_reads_is_shown(
            user in proptest::sample::select(&["", "alice@", "alice:S3CR3T@"][..]),
            params in proptest::collection::vec((
                proptest::collection::vec(proptest::sample::select(&[
                    "password", "pass", "word", "%70ass", "%77", "%77ord", "\t", "ssl",
                ][..]), 1..4),
                proptest::collection::vec(proptest::sample::select(&[
                    "S3CR3T", "#", " ", "?", "=", "'", "\\", "%26", "@",
                ][..]), 0..4),
                proptest::bool::ANY,
            ), 0..4),
        ) {
            let query: Vec<String> = params
                .iter()
                .map(|(name, value, other)| {
                    let other = if *other { "application_name=app&" } else { "" };
                    format!("{other}{}={}", name.concat(), value.concat())
                })
                .collect();
            let url = format!("postgres://{user}db/x?{}", query.join("&"));
            if driver_password(&url).is_some_and(|p| p.contains("S3CR3T")) {
                let shown = redact_url(&url);
                proptest::prop_assert!(!shown.contains("S3CR3T"), "{} -> {}", url, shown);
            }
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
        assert_eq!(redact_url("sqlite:///tmp/x.db"), "sqlite:///tmp/x.db");
        assert_eq!(redact_url("memory:"), "memory:");
    }

    #[test]
    #[cfg(any(feature = "redb", feature = "sqlite"))]
    fn a_store_files_name_is_masked_as_its_url_is() {
        use std::path::Path;
        assert_eq!(super::path_label(Path::new("/var/x.db")), "/var/x.db");
        assert_eq!(
            super::path_label(Path::new("/var/x?password=S3CR3T")),
            "/var/x?password=***"
        );
        assert_eq!(
            super::path_label(Path::new("/a:S3CR3T@b.db")),
            "/a:***@b.db"
        );
    }

    /// Issue 41, item 6: the file schemes' URLs were shown as given, passwords and all.
    #[test]
    fn every_schemes_password_is_masked() {
        for (url, shown) in [
            (
                "redb://alice:S3CR3T@host/x.redb",
                "redb://alice:***@host/x.redb",
            ),
            (
                "sqlite://:S3CR3T@localhost/x.db",
                "sqlite://:***@localhost/x.db",
            ),
            ("SQLITE://alice:S3CR3T@db/x", "SQLITE://alice:***@db/x"),
            (
                "sqlite:///x.db?password=S3CR3T",
                "sqlite:///x.db?password=***",
            ),
            (
                "redb:///x?user=a&pass%77ord=S3CR3T",
                "redb:///x?user=a&pass%77ord=***",
            ),
            (
                "sqlite:/x.db?PASSWORD=S3CR3T&a=b",
                "sqlite:/x.db?PASSWORD=***&a=b",
            ),
            ("mysql://alice:S3CR3T@db/x", "mysql://alice:***@db/x"),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
        }
    }
}
