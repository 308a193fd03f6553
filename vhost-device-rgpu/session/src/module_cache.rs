//! Module images by content: a daemon-wide cache shared by every session
//! and connection, so an image (a fatbin of hundreds of megabytes, loaded by
//! every process of a job) crosses from the guest once.
//!
//! Images are keyed by their SHA-256 as computed here, on the host, from the
//! bytes received: a guest's hash only ever selects an entry, it never names
//! one. The cache is bounded in bytes and evicts the least recently used
//! images first; an image larger than the whole budget is not kept.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use sha2::{Digest, Sha256};

/// A SHA-256 digest.
pub type ImageHash = [u8; 32];

/// Budget of the shared cache unless `RGPU_MODULE_CACHE_MB` says otherwise.
const DEFAULT_CAPACITY_MB: u64 = 1024;

/// The SHA-256 of `bytes`.
pub fn image_hash(bytes: &[u8]) -> ImageHash {
    Sha256::digest(bytes).into()
}

struct CachedImage {
    image: Arc<[u8]>,
    last_used: u64,
}

#[derive(Default)]
struct Inner {
    images: HashMap<ImageHash, CachedImage>,
    bytes: u64,
    /// Logical clock of uses: the smallest `last_used` goes first.
    clock: u64,
}

/// Module images by SHA-256, least recently used evicted first.
pub struct ModuleCache {
    capacity: u64,
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for ModuleCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModuleCache")
            .field("capacity", &self.capacity)
            .field("bytes", &self.bytes())
            .field("len", &self.len())
            .finish()
    }
}

impl ModuleCache {
    /// A cache holding at most `capacity` bytes of images.
    pub fn new(capacity: u64) -> Self {
        Self {
            capacity,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// The daemon's cache, shared by every session: sized by
    /// `RGPU_MODULE_CACHE_MB` (default 1024; 0 turns caching off).
    pub fn shared() -> Arc<ModuleCache> {
        static SHARED: OnceLock<Arc<ModuleCache>> = OnceLock::new();
        SHARED
            .get_or_init(|| {
                let mb = std::env::var("RGPU_MODULE_CACHE_MB")
                    .ok()
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .unwrap_or(DEFAULT_CAPACITY_MB);
                log::info!("module cache: {mb} MiB");
                Arc::new(ModuleCache::new(mb.saturating_mul(1 << 20)))
            })
            .clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // The cache holds no invariant a panicking holder could break
        // halfway that matters more than serving on.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The image cached under `hash`, marked as just used.
    pub fn get(&self, hash: &ImageHash) -> Option<Arc<[u8]>> {
        let mut inner = self.lock();
        inner.clock += 1;
        let now = inner.clock;
        let cached = inner.images.get_mut(hash)?;
        cached.last_used = now;
        Some(cached.image.clone())
    }

    /// Keeps `image` under the hash computed here, evicting the least
    /// recently used images to stay within budget; returns that hash.
    pub fn insert(&self, image: Arc<[u8]>) -> ImageHash {
        let hash = image_hash(&image);
        self.insert_hashed(hash, image);
        hash
    }

    /// [`insert`](Self::insert) for an image whose hash the caller has just
    /// computed with [`image_hash`] from these very bytes.
    pub fn insert_hashed(&self, hash: ImageHash, image: Arc<[u8]>) {
        let size = image.len() as u64;
        if size > self.capacity {
            log::debug!("module cache: a {size}-byte image exceeds the budget; not kept");
            return;
        }
        let mut inner = self.lock();
        inner.clock += 1;
        let now = inner.clock;
        if let Some(cached) = inner.images.get_mut(&hash) {
            cached.last_used = now;
            return;
        }
        while inner.bytes.saturating_add(size) > self.capacity {
            let Some(oldest) = inner
                .images
                .iter()
                .min_by_key(|(_, c)| c.last_used)
                .map(|(h, _)| *h)
            else {
                break;
            };
            if let Some(evicted) = inner.images.remove(&oldest) {
                inner.bytes = inner.bytes.saturating_sub(evicted.image.len() as u64);
                log::debug!("module cache: evicted a {}-byte image", evicted.image.len());
            }
        }
        inner.bytes = inner.bytes.saturating_add(size);
        inner.images.insert(
            hash,
            CachedImage {
                image,
                last_used: now,
            },
        );
    }

    /// Bytes of images held.
    pub fn bytes(&self) -> u64 {
        self.lock().bytes
    }

    /// Number of images held.
    pub fn len(&self) -> usize {
        self.lock().images.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(byte: u8, len: usize) -> Arc<[u8]> {
        vec![byte; len].into()
    }

    #[test]
    fn hash_is_sha256() {
        // FIPS 180-2 test vector.
        let expected = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        let hex: String = image_hash(b"abc")
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(hex, expected);
    }

    #[test]
    fn finds_what_it_keeps_by_content() {
        let cache = ModuleCache::new(1000);
        let a = image(1, 100);
        let hash = cache.insert(a.clone());
        assert_eq!(hash, image_hash(&a));
        assert_eq!(cache.get(&hash).as_deref(), Some(&a[..]));
        assert_eq!(cache.get(&image_hash(b"other")), None);
        // The same content again is one entry.
        cache.insert(image(1, 100));
        assert_eq!((cache.len(), cache.bytes()), (1, 100));
    }

    #[test]
    fn evicts_least_recently_used_within_budget() {
        let cache = ModuleCache::new(300);
        let a = cache.insert(image(1, 100));
        let b = cache.insert(image(2, 100));
        let c = cache.insert(image(3, 100));
        // Using `a` makes `b` the oldest.
        assert!(cache.get(&a).is_some());
        let d = cache.insert(image(4, 150));
        assert!(cache.get(&b).is_none() && cache.get(&c).is_none());
        assert!(cache.get(&a).is_some() && cache.get(&d).is_some());
        assert_eq!((cache.len(), cache.bytes()), (2, 250));
        // Larger than the whole budget: not kept, nothing evicted.
        let huge = cache.insert(image(5, 301));
        assert!(cache.get(&huge).is_none());
        assert_eq!(cache.bytes(), 250);
    }

    #[test]
    fn zero_budget_keeps_nothing() {
        let cache = ModuleCache::new(0);
        let hash = cache.insert(image(1, 1));
        assert!(cache.get(&hash).is_none());
        assert!(cache.is_empty());
    }
}
