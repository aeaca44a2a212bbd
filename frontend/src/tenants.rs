//! Who is asking: the API keys, the tenant each belongs to, and the admin key.
//!
//! - No key configured (the default, loopback only): every caller may do everything and all
//!   share one prefix cache, as before.
//! - `--api-key K`: one key, one tenant (the shared cache); it may also use the admin routes
//!   unless an admin key or a keys file is configured.
//! - `--api-keys-file FILE`: one key per line, optionally followed by a tenant name (`#` starts a
//!   comment). Keys of one tenant share cached prefixes; different tenants never do: the tenant
//!   enters every block hash. A key without a name is a tenant of its own.
//! - `--admin-key K`: the only key the admin routes (`/v1/cache/entries`, `/v1/cache/evict`)
//!   accept once any key is configured.
//!
//! Keys are compared in constant time, all of them, so timing reveals neither a key nor which
//! line matched.

use std::path::Path;
use std::sync::Arc;

/// What a request's bearer token makes of its sender.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// Whose prefix cache the request reads and fills (None: the shared one).
    pub tenant: Option<Arc<str>>,
    /// May list and evict cache entries.
    pub admin: bool,
}

/// A key and its tenant.
type KeyEntry = (Box<[u8]>, Option<Arc<str>>);

/// The configured keys.
#[derive(Debug, Default)]
pub struct Keys {
    /// The single `--api-key` has no tenant.
    keys: Vec<KeyEntry>,
    admin: Option<Box<[u8]>>,
    /// Whether the single `--api-key` may use the admin routes (no admin key, no keys file).
    single_is_admin: bool,
}

impl Keys {
    /// The keys of `--api-key`, `--api-keys-file` (its path and text) and `--admin-key`.
    pub fn new(
        api_key: Option<&str>,
        keys_file: Option<(&Path, &str)>,
        admin_key: Option<&str>,
    ) -> Result<Keys, String> {
        let mut keys = Vec::new();
        let single = api_key.filter(|k| !k.is_empty());
        if let Some(k) = single {
            keys.push((Box::from(k.as_bytes()), None));
        }
        if let Some((path, text)) = keys_file {
            keys.extend(parse_keys_file(path, text)?);
        }
        for (i, (key, _)) in keys.iter().enumerate() {
            if keys[..i].iter().any(|(k, _)| k == key) {
                return Err("the same API key is configured twice".into());
            }
        }
        let admin = admin_key
            .filter(|k| !k.is_empty())
            .map(|k| k.as_bytes().into());
        Ok(Keys {
            single_is_admin: single.is_some() && admin.is_none() && keys_file.is_none(),
            keys,
            admin,
        })
    }

    /// Whether a bearer token is required at all.
    pub fn required(&self) -> bool {
        !self.keys.is_empty() || self.admin.is_some()
    }

    /// Who sent `bearer` (None: not a key of ours, 401).
    pub fn identify(&self, bearer: Option<&str>) -> Option<Caller> {
        if !self.required() {
            return Some(Caller {
                tenant: None,
                admin: true,
            });
        }
        let sent = bearer.unwrap_or("").trim().as_bytes();
        let mut found: Option<&Option<Arc<str>>> = None;
        for (key, tenant) in &self.keys {
            if constant_time_eq(sent, key) {
                found = Some(tenant);
            }
        }
        let admin = self
            .admin
            .as_deref()
            .is_some_and(|a| constant_time_eq(sent, a));
        if admin {
            return Some(Caller {
                tenant: None,
                admin: true,
            });
        }
        found.map(|tenant| Caller {
            tenant: tenant.clone(),
            admin: tenant.is_none() && self.single_is_admin,
        })
    }
}

/// `key [tenant]` per line; blank lines and `#` comments skipped.
fn parse_keys_file(path: &Path, text: &str) -> Result<Vec<KeyEntry>, String> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let mut words = line.split_whitespace();
        let key = words.next().unwrap_or_default();
        let tenant = words.next();
        if words.next().is_some() {
            return Err(format!(
                "{}:{}: expected `KEY [TENANT]`, found more words",
                path.display(),
                n + 1
            ));
        }
        // A key without a name is its own tenant; the name is derived, never the key itself.
        let tenant = tenant.map_or_else(
            || format!("key-{}", &blake3::hash(key.as_bytes()).to_hex()[..16]),
            str::to_string,
        );
        out.push((Box::from(key.as_bytes()), Some(Arc::from(tenant))));
    }
    Ok(out)
}

/// The salt a request's blocks are hashed with: the tenant's and the request's own
/// `cache_salt`, encoded so no two different pairs give the same text.
pub fn cache_salt(tenant: Option<&str>, request: Option<&str>) -> Option<String> {
    match (tenant, request) {
        (None, None) => None,
        pair => serde_json::to_string(&pair).ok(),
    }
}

/// Compares without an early exit (`subtle`), so timing does not reveal how much of a key
/// matched (only whether the lengths differ).
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    a.ct_eq(b).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(text: &str) -> Keys {
        Keys::new(None, Some((Path::new("keys"), text)), None).unwrap()
    }

    #[test]
    fn keys_compare_equal_only_when_identical() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"", b"x"));
        assert!(constant_time_eq(b"", b""));
    }

    #[test]
    fn no_keys_means_everyone_is_admin_of_the_shared_cache() {
        let keys = Keys::default();
        assert!(!keys.required());
        let c = keys.identify(None).unwrap();
        assert_eq!((c.tenant, c.admin), (None, true));
    }

    #[test]
    fn the_single_key_is_admin_only_when_nothing_else_is_configured() {
        let single = Keys::new(Some("k"), None, None).unwrap();
        assert_eq!(single.identify(Some("k")).map(|c| c.admin), Some(true));
        assert_eq!(single.identify(Some("x")), None);
        assert_eq!(single.identify(None), None);
        let with_admin = Keys::new(Some("k"), None, Some("root")).unwrap();
        assert_eq!(with_admin.identify(Some("k")).map(|c| c.admin), Some(false));
        assert_eq!(
            with_admin.identify(Some("root")).map(|c| c.admin),
            Some(true)
        );
    }

    #[test]
    fn a_keys_file_names_tenants_and_unnamed_keys_are_their_own() {
        let keys = file("# team keys\nalpha-1 alpha\nalpha-2 alpha  # laptop\n\nlone\n");
        let t = |k| keys.identify(Some(k)).and_then(|c| c.tenant);
        assert_eq!(t("alpha-1").as_deref(), Some("alpha"));
        assert_eq!(t("alpha-2").as_deref(), Some("alpha"));
        let lone = t("lone").unwrap();
        assert!(lone.starts_with("key-") && !lone.contains("lone"), "{lone}");
        assert_eq!(
            keys.identify(Some("alpha")),
            None,
            "a tenant name is no key"
        );
        assert_eq!(keys.identify(Some("alpha-1")).map(|c| c.admin), Some(false));
    }

    #[test]
    fn a_bad_keys_file_names_the_line() {
        let e = Keys::new(None, Some((Path::new("k.txt"), "a b c\n")), None).unwrap_err();
        assert!(e.contains("k.txt:1"), "{e}");
        let e = Keys::new(Some("a"), Some((Path::new("k"), "a t\n")), None).unwrap_err();
        assert!(e.contains("twice"), "{e}");
    }

    #[test]
    fn salts_of_different_pairs_differ() {
        assert_eq!(cache_salt(None, None), None);
        let all = [
            cache_salt(Some("a"), None),
            cache_salt(None, Some("a")),
            cache_salt(Some("a"), Some("b")),
            cache_salt(Some("a\",\"b"), None),
        ];
        for (i, x) in all.iter().enumerate() {
            for y in &all[i + 1..] {
                assert_ne!(x, y);
            }
        }
    }
}
