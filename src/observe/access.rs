//! Who may read the HTTPS `/metrics`: the bearer token is authenticated by a TokenReview and its
//! user authorised by a SubjectAccessReview for `get` on the non-resource URL `/metrics`, as
//! controller-runtime's `filters.WithAuthenticationAndAuthorization` does, with the same caches:
//! a token's review for a minute (failed ones too), an allowed user for five minutes, a denied
//! one for thirty seconds. The reviews are questions to the API server; nothing is changed.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::Client;
use kube::api::{Api, PostParams};

/// controller-runtime's `authenticatorfactory.DelegatingAuthenticatorConfig.CacheTTL`.
const TOKEN_TTL: Duration = Duration::from_secs(60);
/// Its `authorizerfactory.DelegatingAuthorizerConfig` `AllowCacheTTL` and `DenyCacheTTL`.
const ALLOW_TTL: Duration = Duration::from_secs(5 * 60);
const DENY_TTL: Duration = Duration::from_secs(30);
/// Entries per cache: random tokens must not grow memory without bound.
const MAX_ENTRIES: usize = 4096;

/// The answer to one request for `/metrics`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    Allowed,
    /// No bearer token, or one the API server does not accept: 401.
    Unauthenticated,
    /// An authenticated user without `get` on `/metrics`: 403.
    Forbidden,
    /// A review could not be made: 500, and nothing cached.
    Unknown(String),
}

/// A user as a TokenReview names it, and as a SubjectAccessReview asks about it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct User {
    name: String,
    uid: Option<String>,
    groups: Vec<String>,
    extra: BTreeMap<String, Vec<String>>,
}

pub struct Gate {
    client: Client,
    /// By the token's SHA-256, so no token is kept in memory: the user, or `None` when refused.
    tokens: Mutex<Cache<[u8; 32], Option<User>>>,
    decisions: Mutex<Cache<User, bool>>,
}

impl Gate {
    pub fn new(client: Client) -> Self {
        Gate {
            client,
            tokens: Mutex::new(Cache::default()),
            decisions: Mutex::new(Cache::default()),
        }
    }

    /// Whether the request with this `Authorization` header may read `/metrics`.
    pub async fn check(&self, authorization: Option<&str>) -> Access {
        let Some(token) = authorization
            .and_then(|value| value.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|token| !token.is_empty())
        else {
            return Access::Unauthenticated;
        };
        #[expect(
            clippy::expect_used,
            reason = "SHA-256's output is 32 bytes by definition"
        )]
        let digest: [u8; 32] = ring::digest::digest(&ring::digest::SHA256, token.as_bytes())
            .as_ref()
            .try_into()
            .expect("SHA-256 has 32 bytes");
        let cached = lock(&self.tokens).get(&digest, Instant::now());
        let user = match cached {
            Some(user) => user,
            None => match self.authenticate(token).await {
                Ok(user) => {
                    lock(&self.tokens).put(digest, user.clone(), TOKEN_TTL, Instant::now());
                    user
                }
                Err(error) => return Access::Unknown(format!("TokenReview: {error}")),
            },
        };
        let Some(user) = user else {
            return Access::Unauthenticated;
        };
        let cached = lock(&self.decisions).get(&user, Instant::now());
        let allowed = match cached {
            Some(allowed) => allowed,
            None => match self.authorize(&user).await {
                Ok(allowed) => {
                    let ttl = if allowed { ALLOW_TTL } else { DENY_TTL };
                    lock(&self.decisions).put(user, allowed, ttl, Instant::now());
                    allowed
                }
                Err(error) => return Access::Unknown(format!("SubjectAccessReview: {error}")),
            },
        };
        if allowed {
            Access::Allowed
        } else {
            Access::Forbidden
        }
    }

    async fn authenticate(&self, token: &str) -> Result<Option<User>, kube::Error> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_owned(),
                ..TokenReviewSpec::default()
            },
            ..TokenReview::default()
        };
        let answer = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await?;
        let Some(status) = answer.status.filter(|s| s.authenticated == Some(true)) else {
            return Ok(None);
        };
        Ok(status.user.and_then(|user| {
            Some(User {
                name: user.username.filter(|name| !name.is_empty())?,
                uid: user.uid,
                groups: user.groups.unwrap_or_default(),
                extra: user.extra.unwrap_or_default(),
            })
        }))
    }

    async fn authorize(&self, user: &User) -> Result<bool, kube::Error> {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.name.clone()),
                uid: user.uid.clone(),
                groups: Some(user.groups.clone()),
                extra: Some(user.extra.clone()),
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some("/metrics".into()),
                    verb: Some("get".into()),
                }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        };
        let answer = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await?;
        Ok(answer
            .status
            .is_some_and(|s| s.allowed && s.denied != Some(true)))
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// Answers kept until they expire, at most [`MAX_ENTRIES`] of them.
struct Cache<K, V> {
    entries: HashMap<K, (V, Instant)>,
}

impl<K, V> Default for Cache<K, V> {
    fn default() -> Self {
        Cache {
            entries: HashMap::new(),
        }
    }
}

impl<K: Eq + Hash, V: Clone> Cache<K, V> {
    fn get(&mut self, key: &K, now: Instant) -> Option<V> {
        match self.entries.get(key) {
            Some((value, expires)) if now < *expires => Some(value.clone()),
            Some(_) => {
                self.entries.remove(key);
                None
            }
            None => None,
        }
    }

    fn put(&mut self, key: K, value: V, ttl: Duration, now: Instant) {
        if self.entries.len() >= MAX_ENTRIES {
            self.entries.retain(|_, (_, expires)| now < *expires);
        }
        if self.entries.len() >= MAX_ENTRIES {
            // Full of live answers (a flood of tokens): start over rather than grow.
            self.entries.clear();
        }
        self.entries.insert(key, (value, now + ttl));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_expire_and_the_cache_stays_bounded() {
        let now = Instant::now();
        let mut cache = Cache::default();
        cache.put("a", true, DENY_TTL, now);
        assert_eq!(cache.get(&"a", now + DENY_TTL / 2), Some(true));
        assert_eq!(cache.get(&"a", now + DENY_TTL), None, "expired");
        assert!(cache.entries.is_empty(), "an expired entry is dropped");

        let mut cache = Cache::default();
        for i in 0..MAX_ENTRIES * 3 {
            cache.put(i, (), TOKEN_TTL, now);
        }
        assert!(cache.entries.len() <= MAX_ENTRIES);
        assert_eq!(cache.get(&(MAX_ENTRIES * 3 - 1), now), Some(()));
    }
}
