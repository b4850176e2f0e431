//! Store URLs: the one grammar, its parser, and [`open_url`].

use std::path::{Path, PathBuf};

use crate::Result;
use crate::{redact_url, BindingStore, OpenOptions, StoreError};

/// Which store a store URL names.
///
/// | URL | store | feature |
/// |---|---|---|
/// | `redb:PATH`, `redb:///PATH` | `BindingStore::redb` | `redb` |
/// | `sqlite:PATH`, `sqlite:///PATH` | `BindingStore::sqlite` | `sqlite` |
/// | `postgres://...`, `postgresql://...` | `BindingStore::postgres` | `postgres` |
/// | `memory:` | [`BindingStore::memory`] | always |
///
/// The scheme is case-insensitive. A file store is named one of two ways:
/// - `sqlite:PATH` (and `redb:PATH`): the path verbatim (`%`, `?`, `#` and spaces are part of
///   the name); a leading `~/` is the home directory.
/// - `sqlite://AUTHORITY/PATH`: read as SQLite reads its own `file:` URIs: the authority empty
///   or `localhost` (a store file is local), the path absolute and percent-decoded. Query
///   parameters and fragments are refused: the store sets the connection's options itself,
///   and `mode=ro`, `immutable=1` or a `vfs` would undo its guarantees.
///
/// A bare path (`/tmp/x.redb`) is not a URL: the error suggests the URL its extension points
/// to, or lists the forms. A PostgreSQL URL is parsed whole (one host; libpq-style query
/// parameters); its parameter `schema=NAME` is rethread's (the tables' schema, created if
/// missing), not passed to the server. `Display` and `Debug` never show a password.
///
/// ```
/// use rethread_store::StoreUrl;
/// let url = StoreUrl::parse("sqlite:///var/lib/app/rethread.db").unwrap();
/// assert_eq!(url.path().unwrap().to_str(), Some("/var/lib/app/rethread.db"));
/// assert_eq!(url.to_string(), "sqlite:/var/lib/app/rethread.db");
/// assert!(StoreUrl::parse("mysql://db/x").is_err());
/// assert!(StoreUrl::parse("sqlite://db-host/x.db").is_err());
/// ```
#[non_exhaustive]
#[derive(Clone, PartialEq, Eq)]
pub enum StoreUrl {
    /// A redb file.
    Redb(PathBuf),
    /// A SQLite file.
    Sqlite(PathBuf),
    /// A PostgreSQL database: the URL as given (it may hold a password).
    Postgres(String),
    /// A store in this process's memory.
    Memory,
}

const EXPECTED: &str = "expected `redb:PATH`, `sqlite:PATH`, `postgres://...` or `memory:`";

impl StoreUrl {
    /// Parses a store URL; [`StoreError::UnsupportedUrl`] (the URL redacted) if it is not one.
    /// Whether this build has the backend is checked by [`StoreUrl::open`].
    pub fn parse(url: &str) -> Result<StoreUrl> {
        let unsupported = |reason: &str| StoreError::UnsupportedUrl {
            url: redact_url(url),
            reason: reason.to_string(),
        };
        let Some((scheme, rest)) = url.split_once(':').filter(|(s, _)| is_scheme(s)) else {
            return Err(unsupported(&bare_path_hint(url)));
        };
        let file = || file_path(rest).map_err(|reason| unsupported(&reason));
        match scheme.to_ascii_lowercase().as_str() {
            "redb" => file().map(StoreUrl::Redb),
            "sqlite" => file().map(StoreUrl::Sqlite),
            "memory" => Ok(StoreUrl::Memory),
            "postgres" | "postgresql" => {
                postgres_parts(url)?;
                Ok(StoreUrl::Postgres(url.to_string()))
            }
            _ => Err(unsupported(&format!("unknown scheme; {EXPECTED}"))),
        }
    }

    /// The file of a file store.
    pub fn path(&self) -> Option<&Path> {
        match self {
            StoreUrl::Redb(path) | StoreUrl::Sqlite(path) => Some(path),
            StoreUrl::Postgres(_) | StoreUrl::Memory => None,
        }
    }

    /// Opens the store; a backend this build lacks is [`StoreError::UnsupportedUrl`].
    pub async fn open(&self, options: OpenOptions) -> Result<BindingStore> {
        match self {
            StoreUrl::Memory => {
                let (key, read_only) = (options.store_key(), options.read_only);
                BindingStore::memory().with_key(key, read_only).await
            }
            #[cfg(feature = "redb")]
            StoreUrl::Redb(path) => BindingStore::redb(path, options).await,
            #[cfg(feature = "sqlite")]
            StoreUrl::Sqlite(path) => BindingStore::sqlite(path, options).await,
            #[cfg(feature = "postgres")]
            StoreUrl::Postgres(url) => BindingStore::postgres(url, options).await,
            #[cfg(not(feature = "redb"))]
            StoreUrl::Redb(_) => Err(self.missing("redb")),
            #[cfg(not(feature = "sqlite"))]
            StoreUrl::Sqlite(_) => Err(self.missing("sqlite")),
            #[cfg(not(feature = "postgres"))]
            StoreUrl::Postgres(_) => Err(self.missing("postgres")),
        }
    }

    #[cfg(not(all(feature = "redb", feature = "sqlite", feature = "postgres")))]
    fn missing(&self, feature: &str) -> StoreError {
        StoreError::UnsupportedUrl {
            url: self.to_string(),
            reason: format!("this build has no {feature} backend (feature `{feature}`)"),
        }
    }
}

/// Whether `text` is a URL scheme (RFC 3986: a letter, then letters, digits, `+`, `-`, `.`):
/// what comes before the first `:` of `/tmp/a:b.db` is not.
fn is_scheme(text: &str) -> bool {
    let mut chars = text.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
}

/// What to say about `text`, which has no scheme.
fn bare_path_hint(text: &str) -> String {
    let extension = Path::new(text)
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    let scheme = match extension.as_deref() {
        Some("redb") => "redb",
        Some("sqlite" | "sqlite3" | "db") => "sqlite",
        _ => return format!("not a store URL (a bare path?); {EXPECTED}"),
    };
    format!("a bare path is not a store URL; did you mean `{scheme}:{text}`?")
}

/// The file `rest` (what follows `redb:` or `sqlite:`) names: a path verbatim, or after `//`
/// a URI read as SQLite reads its `file:` URIs (see [`StoreUrl`]). The error is the reason.
fn file_path(rest: &str) -> Result<PathBuf, String> {
    let Some(uri) = rest.strip_prefix("//") else {
        if rest.is_empty() {
            return Err("the URL has no path".into());
        }
        // No shell expands `~` inside a URL.
        return match rest.strip_prefix("~/") {
            Some(under_home) => std::env::home_dir()
                .map(|home| home.join(under_home))
                .ok_or_else(|| "`~` but no home directory".into()),
            None => Ok(PathBuf::from(rest)),
        };
    };
    let (authority, path) = uri.split_at(uri.find('/').unwrap_or(uri.len()));
    if !(authority.is_empty() || authority.eq_ignore_ascii_case("localhost")) {
        // Named by its host alone: a userinfo may hold a password.
        let host = authority.rsplit('@').next().unwrap_or_default();
        return Err(format!(
            "`//{host}` names a host (or a user), and a store file is local: write `///` and \
             an absolute path (`sqlite:///var/x.db`), or no `//` for a relative one \
             (`sqlite:x.db`)"
        ));
    }
    if path.contains(['?', '#']) {
        return Err(
            "query parameters and fragments are not taken (the store sets the \
                    connection's options itself); percent-encode a `?` or `#` of the file \
                    name (`%3F`, `%23`)"
                .into(),
        );
    }
    if path.is_empty() {
        return Err("the URL has no path".into());
    }
    percent_encoding::percent_decode_str(path)
        .decode_utf8()
        .map(|path| PathBuf::from(path.as_ref()))
        .map_err(|_| "the path is not UTF-8 once percent-decoded".into())
}

impl std::fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreUrl::Redb(path) => f.write_str(&redact_url(&format!("redb:{}", path.display()))),
            StoreUrl::Sqlite(path) => {
                f.write_str(&redact_url(&format!("sqlite:{}", path.display())))
            }
            StoreUrl::Postgres(url) => f.write_str(&redact_url(url)),
            StoreUrl::Memory => f.write_str("memory:"),
        }
    }
}

impl std::fmt::Debug for StoreUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StoreUrl({self})")
    }
}

impl std::str::FromStr for StoreUrl {
    type Err = StoreError;

    fn from_str(url: &str) -> Result<Self, Self::Err> {
        StoreUrl::parse(url)
    }
}

/// Opens a store from a URL ([`StoreUrl`]): `redb:PATH`, `sqlite:PATH`, `postgres://...` or
/// `memory:`.
pub async fn open_url(url: &str, options: OpenOptions) -> Result<BindingStore> {
    StoreUrl::parse(url)?.open(options).await
}

/// Splits a PostgreSQL URL into what the driver is given (the URL without rethread's
/// `schema` parameter) and that schema.
pub(crate) fn postgres_parts(url: &str) -> Result<(String, Option<String>)> {
    let mut parsed = url::Url::parse(url).map_err(|e| StoreError::UnsupportedUrl {
        url: redact_url(url),
        reason: format!("not a PostgreSQL URL: {e}"),
    })?;
    let Some(query) = parsed.query().map(str::to_string) else {
        return Ok((parsed.to_string(), None));
    };
    let mut schema = None;
    // The other parameters are passed on exactly as written (the driver decodes them).
    let kept: Vec<&str> = query
        .split('&')
        .filter(|pair| {
            let decoded = url::form_urlencoded::parse(pair.as_bytes()).next();
            match decoded {
                Some((key, value)) if key == "schema" => {
                    schema = Some(value.into_owned());
                    false
                }
                _ => !pair.is_empty(),
            }
        })
        .collect();
    let query = kept.join("&");
    parsed.set_query(Some(query.as_str()).filter(|q| !q.is_empty()));
    Ok((parsed.to_string(), schema))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_urls_keep_their_path_verbatim() {
        for (url, path) in [
            ("redb:/tmp/a.redb", "/tmp/a.redb"),
            ("redb:///tmp/a.redb", "/tmp/a.redb"),
            ("sqlite:rel/a.db", "rel/a.db"),
            ("SQLITE:/tmp/my store?#%20.db", "/tmp/my store?#%20.db"),
        ] {
            let parsed = StoreUrl::parse(url).unwrap();
            assert_eq!(parsed.path(), Some(Path::new(path)), "{url}");
        }
        assert!(matches!(
            StoreUrl::parse("sqlite:/x").unwrap(),
            StoreUrl::Sqlite(_)
        ));
        assert_eq!(StoreUrl::parse("memory:").unwrap(), StoreUrl::Memory);
    }

    #[test]
    fn bad_urls_are_unsupported_and_redacted() {
        for bad in [
            "no-scheme",
            "redb:",
            "sqlite://",
            "mysql://x",
            "postgres://alice:s3cret@localhost:notaport/x",
        ] {
            match StoreUrl::parse(bad) {
                Err(StoreError::UnsupportedUrl { url, .. }) => {
                    assert!(!url.contains("s3cret"), "{url}")
                }
                other => panic!("{bad}: {other:?}"),
            }
        }
    }

    /// Issue 22: `sqlite://` is SQLite's own URI form: the authority empty or `localhost`, the
    /// path absolute and percent-decoded, no query parameters (refused, not passed on).
    #[test]
    fn sqlite_uris_read_as_sqlite_reads_them() {
        for (url, path) in [
            ("sqlite:///tmp/a.db", "/tmp/a.db"),
            ("sqlite://localhost/tmp/a.db", "/tmp/a.db"),
            ("sqlite://LOCALHOST/tmp/a.db", "/tmp/a.db"),
            ("sqlite:///tmp/my%20store%3F.db", "/tmp/my store?.db"),
            ("redb:///tmp/a%23b.redb", "/tmp/a#b.redb"),
        ] {
            let parsed = StoreUrl::parse(url).unwrap();
            assert_eq!(parsed.path(), Some(Path::new(path)), "{url}");
        }
        for (url, says) in [
            ("sqlite://rel/a.db", "`//rel` names a host"),
            (
                "sqlite://db.example.com/var/x.db",
                "`//db.example.com` names a host",
            ),
            ("sqlite://~/x.db", "`//~` names a host"),
            ("redb://x.redb", "`//x.redb` names a host"),
            ("sqlite:///tmp/a.db?mode=ro", "query parameters"),
            ("sqlite:///tmp/a.db#frag", "query parameters"),
            ("sqlite://localhost", "no path"),
            ("sqlite:///tmp/%FF.db", "not UTF-8"),
        ] {
            match StoreUrl::parse(url) {
                Err(StoreError::UnsupportedUrl { reason, .. }) => {
                    assert!(reason.contains(says), "{url}: {reason}")
                }
                other => panic!("{url}: {other:?}"),
            }
        }
    }

    /// Issue 22: `--store /tmp/x.redb` says which URL was meant.
    #[test]
    fn a_bare_path_suggests_the_url_its_extension_points_to() {
        for (bare, says) in [
            ("/tmp/x.redb", "did you mean `redb:/tmp/x.redb`?"),
            ("x.REDB", "did you mean `redb:x.REDB`?"),
            ("/tmp/x.sqlite", "did you mean `sqlite:/tmp/x.sqlite`?"),
            ("data/x.sqlite3", "did you mean `sqlite:data/x.sqlite3`?"),
            ("/tmp/a:b/x.db", "did you mean `sqlite:/tmp/a:b/x.db`?"),
            (
                "/tmp/store",
                "`redb:PATH`, `sqlite:PATH`, `postgres://...` or `memory:`",
            ),
            (
                "./x.json",
                "`redb:PATH`, `sqlite:PATH`, `postgres://...` or `memory:`",
            ),
        ] {
            match StoreUrl::parse(bare) {
                Err(StoreError::UnsupportedUrl { reason, .. }) => {
                    assert!(reason.contains(says), "{bare}: {reason}")
                }
                other => panic!("{bare}: {other:?}"),
            }
        }
    }

    #[test]
    fn the_schema_parameter_is_ours() {
        let (url, schema) =
            postgres_parts("postgres://a:pw@h:5433/db?schema=s1&options=-c%20x%3Dy").unwrap();
        assert_eq!(schema.as_deref(), Some("s1"));
        assert_eq!(url, "postgres://a:pw@h:5433/db?options=-c%20x%3Dy");
        let (url, schema) = postgres_parts("postgresql://h/db?schema=a%20b").unwrap();
        assert_eq!(
            (url.as_str(), schema.as_deref()),
            ("postgresql://h/db", Some("a b"))
        );
        let shown = StoreUrl::parse("postgres://a:pw@h/db").unwrap();
        assert_eq!(shown.to_string(), "postgres://a:***@h/db");
        assert!(!format!("{shown:?}").contains("pw"));
    }
}
