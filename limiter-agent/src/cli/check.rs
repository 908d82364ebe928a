//! `limiter check`: validate a config without touching anything.

use std::{path::Path, process::ExitCode};

use super::CliError;
use crate::{agent::LoadedConfig, config::ProxyConfig};

pub fn run(path: &Path) -> Result<ExitCode, CliError> {
    match LoadedConfig::read(path) {
        Ok(LoadedConfig { config, secrets }) => {
            for warning in secrets.warnings() {
                eprintln!("warning: {warning}");
            }
            for proxy in config.unshielded_trusted_proxies() {
                eprintln!(
                    "warning: proxy.trusted_proxies {proxy} is not covered by an [[xdp.cidr]] allow or limit rule: \
                     the kernel layer limits it as one client (or a deny rule drops it), with all of its clients' \
                     traffic; give it a rule with action = \"allow\" or a \"limit\" sized for it"
                );
            }
            if config.tightening_nothing() {
                eprintln!(
                    "warning: proxy.adaptive.kernel.tighten_new_sources has nothing to scale: there is no \
                     [xdp.new_sources] budget (or no [xdp] section)"
                );
            }
            for rule in config.deny_rules_not_escalating() {
                eprintln!(
                    "warning: proxy.rules {rule:?} (action = \"deny\") no longer counts towards escalation: deny \
                     rules escalate only with escalate = true, since a third party can make a browser send any \
                     path; set it if only the client itself makes this rule refuse"
                );
            }
            let proxy = config.proxy.as_ref();
            let proxy_warnings = proxy.into_iter().flat_map(|proxy: &ProxyConfig| {
                proxy
                    .store_failure_warning()
                    .into_iter()
                    .chain(proxy.path_case_warnings())
                    .chain(proxy.connection_bound_warnings())
                    .chain(proxy.unscoped_keys_warning())
            });
            let xdp_warnings = config.xdp.iter().flat_map(|xdp| {
                xdp.syn_warnings(proxy)
                    .into_iter()
                    .chain(xdp.verified_warning(proxy))
                    .chain(xdp.services_warning(proxy))
            });
            for warning in proxy_warnings.chain(xdp_warnings) {
                eprintln!("warning: {warning}");
            }
            let layers = [config.xdp.is_some().then_some("xdp"), config.proxy.is_some().then_some("proxy")];
            let layers: Vec<&str> = layers.into_iter().flatten().collect();
            println!(
                "{}: ok ({})",
                path.display(),
                if layers.is_empty() { "nothing enabled".to_owned() } else { layers.join(", ") }
            );
            for line in config.xdp.iter().flat_map(|xdp| xdp.spoofing_summary(proxy)) {
                println!("  {line}");
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(error) => {
            eprintln!("{error}");
            Ok(ExitCode::FAILURE)
        }
    }
}
