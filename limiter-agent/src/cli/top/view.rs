//! What `limiter top --watch` shows, computed from two snapshots: rates per second of
//! the heaviest sources (kernel layer) and clients (proxy), sorted as asked. Pure, so
//! the screen and the plain output show the same thing and tests need no agent.

use std::fmt::Write as _;

use crate::{proxy::ClientRow, xdp::SourceRow};

/// The order of both tables.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Sort {
    /// Packets (sources) and requests (clients) per second.
    #[default]
    Rate,
    /// Drops (sources) and refusals (clients) per second.
    Drops,
    /// Fewest tokens left first (sources); clients by refusals.
    Tokens,
}

impl Sort {
    /// The next order, for the screen's `s` key.
    #[must_use]
    pub fn next(self) -> Self {
        match self {
            Self::Rate => Self::Drops,
            Self::Drops => Self::Tokens,
            Self::Tokens => Self::Rate,
        }
    }

    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Rate => "rate",
            Self::Drops => "drops",
            Self::Tokens => "tokens",
        }
    }
}

/// One look at both layers.
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// Every tracked source; `None` without pinned maps.
    pub sources: Option<Vec<SourceRow>>,
    /// The proxy's heaviest clients, or why there are none.
    pub clients: Result<Vec<ClientRow>, String>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct SourceRate {
    pub source: String,
    pub note: Option<String>,
    pub packets_per_sec: f64,
    pub drops_per_sec: f64,
    pub tokens: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ClientRate {
    pub client: String,
    pub requests_per_sec: f64,
    pub refusals_per_sec: f64,
    pub refused_by: Option<String>,
}

/// One frame of `top --watch`.
#[derive(Clone, Debug, PartialEq)]
pub struct View {
    pub interval_secs: f64,
    pub sort: Sort,
    /// Rows shown of each table.
    pub n: usize,
    /// `None`: the kernel layer has no pinned maps.
    pub sources: Option<Vec<SourceRate>>,
    pub clients: Result<Vec<ClientRate>, String>,
}

impl View {
    /// The rates between `before` and `now`, `secs` apart; `n` rows of each shown.
    #[must_use]
    pub fn between(before: &Snapshot, now: &Snapshot, secs: f64, sort: Sort, n: usize) -> Self {
        let per_sec = |delta: u64| if secs > 0.0 { delta as f64 / secs } else { 0.0 };
        let sources = now.sources.as_ref().map(|rows| {
            let earlier = |source: &str| {
                before
                    .sources
                    .iter()
                    .flatten()
                    .find(|row| row.source == source)
                    .map_or((0, 0), |r| (r.packets, r.dropped))
            };
            rows.iter()
                .map(|row| {
                    let (packets, dropped) = earlier(&row.source);
                    SourceRate {
                        source: row.source.clone(),
                        note: row.note.map(str::to_owned),
                        packets_per_sec: per_sec(row.packets.saturating_sub(packets)),
                        drops_per_sec: per_sec(row.dropped.saturating_sub(dropped)),
                        tokens: row.tokens,
                    }
                })
                .collect()
        });
        let clients = now.clients.as_ref().map_err(Clone::clone).map(|rows| {
            let earlier = |client: &str| {
                let rows = before.clients.as_ref().ok().into_iter().flatten();
                rows.clone().find(|row| row.client == client).map_or((0, 0), |r| (r.requests, r.refused))
            };
            rows.iter()
                .map(|row| {
                    let (requests, refused) = earlier(&row.client);
                    ClientRate {
                        client: row.client.clone(),
                        requests_per_sec: per_sec(row.requests.saturating_sub(requests)),
                        refusals_per_sec: per_sec(row.refused.saturating_sub(refused)),
                        refused_by: row.refused_by.clone(),
                    }
                })
                .collect()
        });
        let mut view = Self { interval_secs: secs, sort, n, sources, clients };
        view.sort_by(sort);
        view
    }

    /// Orders both tables by `sort`.
    pub fn sort_by(&mut self, sort: Sort) {
        self.sort = sort;
        if let Some(sources) = &mut self.sources {
            sources.sort_by(|a, b| {
                let order = match sort {
                    Sort::Rate => b.packets_per_sec.total_cmp(&a.packets_per_sec),
                    Sort::Drops => b.drops_per_sec.total_cmp(&a.drops_per_sec),
                    Sort::Tokens => a.tokens.cmp(&b.tokens),
                };
                order.then_with(|| a.source.cmp(&b.source))
            });
        }
        if let Ok(clients) = &mut self.clients {
            clients.sort_by(|a, b| {
                let order = match sort {
                    Sort::Rate => b.requests_per_sec.total_cmp(&a.requests_per_sec),
                    Sort::Drops | Sort::Tokens => b.refusals_per_sec.total_cmp(&a.refusals_per_sec),
                };
                order.then_with(|| a.client.cmp(&b.client))
            });
        }
    }

    /// The sources table's rows, as the screen and the plain output print them.
    #[must_use]
    pub fn source_cells(&self) -> Vec<[String; 4]> {
        let rows = self.sources.iter().flatten().take(self.n);
        rows.map(|row| {
            let source = match &row.note {
                Some(note) => format!("{} ({note})", row.source),
                None => row.source.clone(),
            };
            [source, format!("{:.1}", row.packets_per_sec), format!("{:.1}", row.drops_per_sec), row.tokens.to_string()]
        })
        .collect()
    }

    /// The clients table's rows.
    #[must_use]
    pub fn client_cells(&self) -> Vec<[String; 4]> {
        let rows = self.clients.iter().flatten().take(self.n);
        rows.map(|row| {
            [
                row.client.clone(),
                format!("{:.1}", row.requests_per_sec),
                format!("{:.1}", row.refusals_per_sec),
                row.refused_by.clone().unwrap_or_else(|| "-".to_owned()),
            ]
        })
        .collect()
    }

    /// The frame as text, for output that is not a terminal.
    #[must_use]
    pub fn plain(&self) -> String {
        let mut out = format!("limiter top · every {:.0} s · sorted by {}\n", self.interval_secs, self.sort.name());
        match &self.sources {
            Some(_) => table(&mut out, SOURCE_HEADER, &self.source_cells()),
            None => out += "xdp: no pinned maps\n",
        }
        match &self.clients {
            Ok(_) => table(&mut out, CLIENT_HEADER, &self.client_cells()),
            Err(why) => {
                let _ = writeln!(out, "proxy: {why}");
            }
        }
        out
    }
}

pub const SOURCE_HEADER: [&str; 4] = ["source", "packets/s", "drops/s", "tokens"];
pub const CLIENT_HEADER: [&str; 4] = ["client", "requests/s", "refused/s", "refused by"];

fn table(out: &mut String, header: [&str; 4], rows: &[[String; 4]]) {
    let _ = writeln!(out, "{:<45} {:>12} {:>12} {:>10}", header[0], header[1], header[2], header[3]);
    for [a, b, c, d] in rows {
        let _ = writeln!(out, "{a:<45} {b:>12} {c:>12} {d:>10}");
    }
}

#[cfg(test)]
mod tests {
    use super::{Snapshot, Sort, View};
    use crate::{proxy::ClientRow, xdp::SourceRow};

    fn source(source: &str, packets: u64, dropped: u64, tokens: u64) -> SourceRow {
        SourceRow { source: source.to_owned(), packets, dropped, tokens, note: None }
    }

    fn client(client: &str, requests: u64, refused: u64) -> ClientRow {
        ClientRow { client: client.to_owned(), requests, refused, refused_by: Some("login".to_owned()) }
    }

    #[test]
    fn rates_are_the_differences_over_the_interval_and_new_rows_count_from_zero() {
        let before = Snapshot {
            sources: Some(vec![source("192.0.2.1", 1_000, 0, 50), source("192.0.2.2", 100, 90, 0)]),
            clients: Ok(vec![client("ip 192.0.2.1", 10, 0)]),
        };
        let now = Snapshot {
            sources: Some(vec![
                source("192.0.2.1", 1_200, 0, 40),
                source("192.0.2.2", 2_100, 1_990, 0),
                source("192.0.2.3", 10, 0, 90),
            ]),
            clients: Ok(vec![client("ip 192.0.2.1", 30, 4), client("key k-pay", 2, 0)]),
        };
        let view = View::between(&before, &now, 2.0, Sort::Rate, 2);
        let sources: Vec<(&str, f64, f64)> = view
            .sources
            .iter()
            .flatten()
            .map(|row| (row.source.as_str(), row.packets_per_sec, row.drops_per_sec))
            .collect();
        assert_eq!(sources, [("192.0.2.2", 1_000.0, 950.0), ("192.0.2.1", 100.0, 0.0), ("192.0.2.3", 5.0, 0.0)]);
        let clients: Vec<(&str, f64, f64)> = view
            .clients
            .iter()
            .flatten()
            .map(|row| (row.client.as_str(), row.requests_per_sec, row.refusals_per_sec))
            .collect();
        assert_eq!(clients, [("ip 192.0.2.1", 10.0, 2.0), ("key k-pay", 1.0, 0.0)]);

        let plain = view.plain();
        let lines: Vec<&str> = plain.lines().collect();
        assert_eq!(lines[0], "limiter top · every 2 s · sorted by rate");
        assert!(lines[1].starts_with("source ") && lines[1].ends_with("    tokens"), "{plain}");
        assert_eq!(lines[2], format!("{:<45} {:>12} {:>12} {:>10}", "192.0.2.2", "1000.0", "950.0", "0"));
        assert_eq!(lines.len(), 7, "two sources, two clients and the headers: {plain}");
        assert_eq!(lines[5], format!("{:<45} {:>12} {:>12} {:>10}", "ip 192.0.2.1", "10.0", "2.0", "login"));

        let mut view = view;
        view.sort_by(Sort::Tokens);
        let order: Vec<&str> = view.sources.iter().flatten().map(|row| row.source.as_str()).collect();
        assert_eq!(order, ["192.0.2.2", "192.0.2.1", "192.0.2.3"], "fewest tokens first");
        let unreachable = Snapshot { sources: None, clients: Err("agent not reachable".to_owned()) };
        let plain = View::between(&unreachable, &unreachable, 1.0, Sort::Drops, 5).plain();
        assert!(plain.ends_with("xdp: no pinned maps\nproxy: agent not reachable\n"), "{plain}");
    }
}
