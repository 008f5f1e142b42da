//! What the benchmarks share: the local gateway's settings for a bench.

use dhukuti::Settings;

/// The local gateway on the embedded store in `tmp`, on a free port, with
/// no background sweeps or webhook polling.
pub fn local_settings(tmp: &std::path::Path) -> std::result::Result<Settings, String> {
    Ok(Settings {
        addr: "127.0.0.1:0".parse().map_err(|_| "addr")?,
        data_dir: tmp.to_path_buf(),
        backend: shared::app::Backend::embedded(tmp),
        init: false,
        demo_payments: false,
        public_url: None,
        dashboard_url: None,
        sweep_every: None,
        provider_timeout: None,
        webhooks: Default::default(),
        webhook_poll: None,
    })
}
