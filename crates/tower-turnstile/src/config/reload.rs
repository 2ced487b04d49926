//! [`ConfigReload`]: a layer built from a file takes a new version of the file while it runs.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use turnstile_core::Backend;

use super::{BackendConfig, ConfigFileError, ConfigKey, LayerConfig};
use crate::error::InvalidLayer;
use crate::layer::RateLimitLayer;
use crate::limiter::LiveLimiter;

/// Reloads the configuration of a layer built from a TOML file while it serves: key, rules,
/// policies, tiers, actions and every other setting are swapped at once, for requests that
/// arrive afterwards (a request already in the layer finishes under the configuration it
/// arrived with).
///
/// What carries over:
/// - **Counters**: the backend (and its local fallback) is kept, so every key keeps its state.
///   A policy whose parameters changed under the same name follows the backends'
///   carry-over rule (buckets keep the units in use, windows their counts, capped at the new
///   limits); a renamed policy starts fresh.
/// - [`RateLimitLayer::shadow_denied`] and the backend-incident state (one warning per
///   incident) are shared with the configuration before.
///
/// What is refused, leaving the configuration in force untouched and logging an `ERROR`
/// (target `turnstile`):
/// - a file that fails validation, with the error `turnstile check-config` prints for it
///   ([`ReloadError::Invalid`]);
/// - a changed `[backend]` section: the backend is built once, so that needs a restart
///   ([`ReloadError::BackendChanged`]).
///
/// # Triggering a reload
/// - On a signal: call [`ConfigReload::reload`] when it arrives, for instance on `SIGHUP`
///   with tokio's `signal` feature (the `quickstart` example does this with `--config`):
///   ```no_run
///   # #[cfg(unix)]
///   # async fn on_sighup(reload: tower_turnstile::config::ConfigReload<tower_turnstile::MemoryBackend>) -> std::io::Result<()> {
///   use tokio::signal::unix::{signal, SignalKind};
///   let mut hangups = signal(SignalKind::hangup())?;
///   while hangups.recv().await.is_some() {
///       // Refusals are logged; the configuration in force stays.
///       let _ = reload.reload();
///   }
///   # Ok(()) }
///   ```
/// - On a change of the file: spawn [`ConfigReload::watch`], which looks at the file every
///   interval and reloads when its contents change.
///
/// # Examples
/// ```
/// use tower_turnstile::config::{ConfigReload, LayerConfig};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = std::env::temp_dir().join(format!("turnstile-doc-reload-{}", std::process::id()));
/// # std::fs::create_dir_all(&dir)?;
/// # let path = dir.join("turnstile.toml");
/// # std::fs::write(&path, "policies = [\"gcra:limit=10,period=1m,name=per-ip\"]\n")?;
/// let config = LayerConfig::from_file(&path)?;
/// let layer = config.builder().build()?; // or `.backend(redis)` before `build`
/// let (layer, reload) = ConfigReload::new(&path, &config, layer);
/// // ... serve with `layer`; later, after editing the file:
/// # std::fs::write(&path, "policies = [\"gcra:limit=20,period=1m,name=per-ip\"]\n")?;
/// reload.reload()?;
/// assert_eq!(reload.current().policies()[0].limit(), 20);
/// # let _ = layer; Ok(()) }
/// ```
pub struct ConfigReload<B> {
    inner: Arc<Inner<B>>,
}

struct Inner<B> {
    path: PathBuf,
    live: LiveLimiter<B, ConfigKey>,
    /// The configuration in force, and the text it was read from.
    current: Mutex<(Arc<LayerConfig>, Option<String>)>,
}

impl<B> Clone for ConfigReload<B> {
    fn clone(&self) -> Self {
        ConfigReload {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<B> fmt::Debug for ConfigReload<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConfigReload")
            .field("path", &self.inner.path)
            .finish_non_exhaustive()
    }
}

/// Why a reload was refused; the configuration in force stays.
#[derive(Debug)]
#[non_exhaustive]
pub enum ReloadError {
    /// The file cannot be read or fails validation: the error `turnstile check-config`
    /// prints for it.
    Invalid(ConfigFileError),
    /// The `[backend]` section changed; the backend is built once, so applying it needs a
    /// restart.
    BackendChanged {
        /// The section in force.
        running: Box<BackendConfig>,
        /// The section in the file.
        file: Box<BackendConfig>,
    },
    /// The file's layer could not be built.
    Layer(InvalidLayer),
}

impl fmt::Display for ReloadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReloadError::Invalid(e) => e.fmt(f),
            ReloadError::BackendChanged { .. } => f.write_str(
                "the [backend] section changed; restart the service to apply it (the running configuration stays in force)",
            ),
            ReloadError::Layer(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for ReloadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ReloadError::Invalid(e) => Some(e),
            ReloadError::Layer(e) => Some(e),
            ReloadError::BackendChanged { .. } => None,
        }
    }
}

impl<B: Backend> ConfigReload<B> {
    /// Makes `layer` — built from `config`, read from the file at `path` — reloadable:
    /// returns the layer to serve with (every service it builds reads the configuration in
    /// force once per request) and the handle that reloads it.
    pub fn new(
        path: impl AsRef<Path>,
        config: &LayerConfig,
        layer: RateLimitLayer<B, ConfigKey>,
    ) -> (RateLimitLayer<B, ConfigKey>, Self) {
        let path = path.as_ref().to_path_buf();
        let text = std::fs::read_to_string(&path).ok();
        let (layer, live) = layer.into_live();
        let reload = ConfigReload {
            inner: Arc::new(Inner {
                path,
                live,
                current: Mutex::new((Arc::new(config.clone()), text)),
            }),
        };
        (layer, reload)
    }

    /// The file this handle reloads.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// The configuration in force.
    pub fn current(&self) -> Arc<LayerConfig> {
        match self.inner.current.lock() {
            Ok(c) => Arc::clone(&c.0),
            Err(poisoned) => Arc::clone(&poisoned.into_inner().0),
        }
    }

    /// Reads the file again and, if it is valid and its `[backend]` section unchanged,
    /// puts it in force for every request that arrives from now on. Logs the outcome (INFO
    /// when applied, ERROR when refused).
    ///
    /// # Errors
    /// [`ReloadError`]; the configuration in force then stays.
    pub fn reload(&self) -> Result<(), ReloadError> {
        let text = std::fs::read_to_string(&self.inner.path).ok();
        let result = LayerConfig::from_file(&self.inner.path)
            .map_err(ReloadError::Invalid)
            .and_then(|config| self.apply(config, text));
        self.log(&result);
        result
    }

    /// Puts `config` in force (as [`ConfigReload::reload`] does with the file's contents):
    /// for configurations from elsewhere than the file.
    ///
    /// # Errors
    /// [`ReloadError::BackendChanged`] or [`ReloadError::Layer`]; the configuration in force
    /// then stays.
    pub fn reload_from(&self, config: LayerConfig) -> Result<(), ReloadError> {
        let result = self.apply(config, None);
        self.log(&result);
        result
    }

    /// Looks at the file every `every` and reloads it when its contents change (a file that
    /// cannot be read counts as a change, refused and logged; each bad version is reported
    /// once). Runs until dropped: spawn it, `tokio::spawn(reload.clone().watch(every))`.
    /// Reading the file is a small blocking read on the runtime's thread.
    pub async fn watch(self, every: Duration) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_seen = self.text_in_force();
        loop {
            tick.tick().await;
            let text = std::fs::read_to_string(&self.inner.path).ok();
            if text == last_seen {
                continue;
            }
            last_seen.clone_from(&text);
            let _ = self.reload();
        }
    }

    fn text_in_force(&self) -> Option<String> {
        match self.inner.current.lock() {
            Ok(c) => c.1.clone(),
            Err(poisoned) => poisoned.into_inner().1.clone(),
        }
    }

    fn apply(&self, config: LayerConfig, text: Option<String>) -> Result<(), ReloadError> {
        let mut current = match self.inner.current.lock() {
            Ok(c) => c,
            Err(poisoned) => poisoned.into_inner(),
        };
        if config.backend() != current.0.backend() {
            return Err(ReloadError::BackendChanged {
                running: Box::new(current.0.backend().clone()),
                file: Box::new(config.backend().clone()),
            });
        }
        // The new key and settings; the backend (with its fallback) and the counters of the
        // configuration in force carry over.
        let built = config.builder().build().map_err(ReloadError::Layer)?;
        let running = self.inner.live.load_full();
        let next = running.sharing_stats(
            running.backend.clone(),
            built.limiter.key.clone(),
            Arc::clone(&built.limiter.settings),
        );
        self.inner.live.store(Arc::new(next));
        *current = (Arc::new(config), text);
        Ok(())
    }

    fn log(&self, result: &Result<(), ReloadError>) {
        let path = self.inner.path.display();
        match result {
            Ok(()) => {
                tracing::info!(target: "turnstile", path = %path, "rate-limit configuration reloaded");
            }
            Err(e @ ReloadError::BackendChanged { .. }) => {
                tracing::error!(target: "turnstile", path = %path, "rate-limit configuration not reloaded: {e}");
            }
            Err(e) => {
                tracing::error!(target: "turnstile", path = %path, "rate-limit configuration not reloaded, the previous one stays in force: {e}");
            }
        }
    }
}
