//! Module images by content: a daemon-wide cache shared by every session
//! and connection, so an image (a fatbin of hundreds of megabytes, loaded by
//! every process of a job) crosses from the guest once.
//!
//! Images are keyed by their SHA-256 as computed here, on the host, from the
//! bytes received: a guest's hash only ever selects an entry, it never names
//! one. The cache is bounded in bytes and evicts the least recently used
//! images first; an image larger than the whole budget is not kept.
//!
//! The daemon serves each connection in a process of its own, so the cache
//! of one process would not outlive its connection. When the settings name
//! a directory (`--module-cache-dir`; the daemon's parent process creates a
//! private one for each tenant's children), images are also kept there,
//! one file per image named by its hash, so that later processes find them:
//! a file is written under a temporary name and renamed, so it is complete
//! when seen; it is hashed again when read, so a damaged file is a miss;
//! the directory is held to the same byte budget, oldest files first.

use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use sha2::{Digest, Sha256};

/// A SHA-256 digest.
pub type ImageHash = [u8; 32];

/// Budget of the cache unless `--module-cache-mb` says otherwise.
/// The cache's size when nobody says (`--module-cache-mb`).
pub const DEFAULT_CAPACITY_MB: u64 = 1024;

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
    /// Images shared with the daemon's other processes, if any.
    directory: Option<PathBuf>,
}

impl std::fmt::Debug for ModuleCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModuleCache")
            .field("capacity", &self.capacity)
            .field("bytes", &self.bytes())
            .field("len", &self.len())
            .field("directory", &self.directory)
            .finish()
    }
}

impl ModuleCache {
    /// A cache holding at most `capacity` bytes of images.
    pub fn new(capacity: u64) -> Self {
        Self {
            capacity,
            inner: Mutex::new(Inner::default()),
            directory: None,
        }
    }

    /// A cache that also keeps images as files in `directory`, shared with
    /// other processes (see the module docs).
    pub fn with_directory(capacity: u64, directory: PathBuf) -> Self {
        Self {
            directory: Some(directory),
            ..Self::new(capacity)
        }
    }

    /// A cache of `megabytes` MiB (0 turns caching off), also kept in
    /// `directory` if given (shared by the processes that name it).
    pub fn configured(megabytes: u64, directory: Option<PathBuf>) -> Self {
        let capacity = megabytes.saturating_mul(1 << 20);
        match directory {
            Some(dir) if !dir.as_os_str().is_empty() => {
                log::debug!("module cache: {megabytes} MiB, shared in {}", dir.display());
                ModuleCache::with_directory(capacity, dir)
            }
            _ => {
                log::debug!("module cache: {megabytes} MiB");
                ModuleCache::new(capacity)
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // The cache holds no invariant a panicking holder could break
        // halfway that matters more than serving on.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The image cached under `hash`, marked as just used.
    pub fn get(&self, hash: &ImageHash) -> Option<Arc<[u8]>> {
        let held = {
            let mut inner = self.lock();
            inner.clock += 1;
            let now = inner.clock;
            inner.images.get_mut(hash).map(|cached| {
                cached.last_used = now;
                cached.image.clone()
            })
        };
        if let Some(image) = held {
            self.touch_file(hash);
            return Some(image);
        }
        let image = self.read_file(hash)?;
        self.remember(*hash, image.clone());
        Some(image)
    }

    /// The image of `hash` from the shared directory, if it is there and
    /// its content still has that hash.
    fn read_file(&self, hash: &ImageHash) -> Option<Arc<[u8]>> {
        let path = self.directory.as_ref()?.join(hex(hash));
        let image: Arc<[u8]> = fs::read(&path).ok()?.into();
        if image_hash(&image) != *hash {
            log::warn!("module cache: {} is damaged; ignored", path.display());
            return None;
        }
        self.touch_file(hash);
        Some(image)
    }

    /// Marks the file of `hash` as just used, for the directory's eviction
    /// order (other processes use it too).
    fn touch_file(&self, hash: &ImageHash) {
        let Some(directory) = &self.directory else {
            return;
        };
        if let Ok(file) = fs::File::options()
            .write(true)
            .open(directory.join(hex(hash)))
        {
            let _ = file.set_modified(SystemTime::now());
        }
    }

    /// Writes `image` into the shared directory (if any, and if it is not
    /// there yet), then trims the directory to the budget.
    fn write_file(&self, hash: &ImageHash, image: &[u8]) {
        let Some(directory) = &self.directory else {
            return;
        };
        let path = directory.join(hex(hash));
        if path.exists() {
            return;
        }
        let temporary = directory.join(format!(".{}.{}", hex(hash), std::process::id()));
        let written = fs::File::create(&temporary)
            .and_then(|mut file| file.write_all(image))
            .and_then(|()| fs::rename(&temporary, &path));
        if let Err(e) = written {
            log::warn!(
                "module cache: cannot keep an image in {}: {e}",
                directory.display()
            );
            let _ = fs::remove_file(&temporary);
            return;
        }
        trim_directory(directory, self.capacity);
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
        if image.len() as u64 > self.capacity {
            log::debug!(
                "module cache: a {}-byte image exceeds the budget; not kept",
                image.len()
            );
            return;
        }
        self.write_file(&hash, &image);
        self.remember(hash, image);
    }

    /// Keeps `image` in memory, evicting to stay within budget.
    fn remember(&self, hash: ImageHash, image: Arc<[u8]>) {
        let size = image.len() as u64;
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

fn hex(hash: &ImageHash) -> String {
    hash.iter().map(|b| format!("{b:02x}")).collect()
}

/// Removes the least recently used image files of `directory` until the
/// rest fit in `capacity` bytes. Another process may trim at the same time:
/// a file already gone is fine.
fn trim_directory(directory: &Path, capacity: u64) {
    let Ok(entries) = fs::read_dir(directory) else {
        return;
    };
    let mut files: Vec<(SystemTime, u64, PathBuf)> = entries
        .filter_map(Result::ok)
        // Temporary files (leading dot) are another writer's, not yet images.
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .filter_map(|e| {
            let meta = e.metadata().ok()?;
            Some((meta.modified().ok()?, meta.len(), e.path()))
        })
        .collect();
    let mut total: u64 = files.iter().map(|(_, len, _)| len).sum();
    files.sort();
    for (_, len, path) in files {
        if total <= capacity {
            break;
        }
        let _ = fs::remove_file(&path);
        total = total.saturating_sub(len);
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

    #[test]
    fn directory_shares_images_between_caches_within_budget() {
        let dir =
            std::env::temp_dir().join(format!("rgpu-module-cache-test-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let first = ModuleCache::with_directory(250, dir.clone());
        let a = first.insert(image(1, 100));
        // Another process's cache: found in the directory.
        let second = ModuleCache::with_directory(250, dir.clone());
        assert_eq!(second.get(&a).as_deref(), Some(&image(1, 100)[..]));
        // A damaged file is a miss.
        let b = first.insert(image(2, 100));
        fs::write(dir.join(hex(&b)), [9u8; 100]).unwrap();
        assert!(second.get(&b).is_none());
        // Over budget: the oldest file goes.
        std::thread::sleep(std::time::Duration::from_millis(20));
        second.get(&a).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let c = first.insert(image(3, 100));
        assert!(dir.join(hex(&a)).exists() && dir.join(hex(&c)).exists());
        assert!(!dir.join(hex(&b)).exists());
        fs::remove_dir_all(&dir).unwrap();
    }
}
