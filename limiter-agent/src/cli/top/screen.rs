//! `limiter top --watch` on a terminal: the [`View`] drawn with ratatui, refreshed
//! every interval; `s` changes the order, `q` (or Esc, or Ctrl-C) quits.

use std::time::{Duration, Instant};

use ratatui::{
    Frame, Terminal,
    crossterm::{
        event::{self, Event, KeyCode, KeyEventKind, KeyModifiers},
        execute,
        terminal::{EnterAlternateScreen, LeaveAlternateScreen, disable_raw_mode, enable_raw_mode},
    },
    layout::{Constraint, Layout},
    style::{Modifier, Style},
    text::Line,
    widgets::{Block, Cell, Row, Table},
};

use super::view::{CLIENT_HEADER, SOURCE_HEADER, Sort, View};

/// Draws one frame of `view`.
pub fn draw(frame: &mut Frame<'_>, view: &View) {
    let [title, sources, clients] =
        Layout::vertical([Constraint::Length(1), Constraint::Fill(1), Constraint::Fill(1)]).areas(frame.area());
    frame.render_widget(
        Line::from(format!(
            "limiter top · every {:.0} s · sorted by {} · s: sort · q: quit",
            view.interval_secs,
            view.sort.name()
        )),
        title,
    );
    let widths = [Constraint::Fill(1), Constraint::Length(12), Constraint::Length(12), Constraint::Length(16)];
    let header_style = Style::new().add_modifier(Modifier::BOLD);
    // The rates right-aligned, so that their magnitudes line up.
    let row = |[name, rate, drops, last]: [String; 4]| {
        Row::new([
            Cell::from(name),
            Cell::from(Line::from(rate).right_aligned()),
            Cell::from(Line::from(drops).right_aligned()),
            Cell::from(last),
        ])
    };
    let table = |header: [&str; 4], cells: Vec<[String; 4]>, title: String| {
        Table::new(cells.into_iter().map(row), widths)
            .column_spacing(2)
            .header(row(header.map(str::to_owned)).style(header_style))
            .block(Block::bordered().title(title))
    };
    let kernel = match &view.sources {
        Some(_) => "kernel layer: heaviest sources".to_owned(),
        None => "kernel layer: no pinned maps".to_owned(),
    };
    frame.render_widget(table(SOURCE_HEADER, view.source_cells(), kernel), sources);
    let proxy = match &view.clients {
        Ok(_) => "proxy: heaviest clients".to_owned(),
        Err(why) => format!("proxy: {why}"),
    };
    frame.render_widget(table(CLIENT_HEADER, view.client_cells(), proxy), clients);
}

/// Puts the terminal back however the screen ends.
struct Restore;

impl Drop for Restore {
    fn drop(&mut self) {
        let _ = disable_raw_mode();
        let _ = execute!(std::io::stdout(), LeaveAlternateScreen);
    }
}

/// What a key press asks for.
enum Action {
    Quit,
    Resort,
}

/// Runs the screen: `frame(sort)` is called once per interval for a new view.
pub fn run(interval: Duration, mut sort: Sort, mut frame: impl FnMut(Sort) -> View) -> std::io::Result<()> {
    enable_raw_mode()?;
    let _restore = Restore;
    execute!(std::io::stdout(), EnterAlternateScreen)?;
    let mut terminal = Terminal::new(ratatui::backend::CrosstermBackend::new(std::io::stdout()))?;
    let mut view = frame(sort);
    loop {
        terminal.draw(|f| draw(f, &view))?;
        let next = Instant::now() + interval;
        loop {
            let left = next.saturating_duration_since(Instant::now());
            if left.is_zero() {
                view = frame(sort);
                break;
            }
            match wait_for_key(left)? {
                Some(Action::Quit) => return Ok(()),
                Some(Action::Resort) => {
                    sort = sort.next();
                    view.sort_by(sort);
                    terminal.draw(|f| draw(f, &view))?;
                }
                None => {}
            }
        }
    }
}

/// The next key that means something, within `within`.
fn wait_for_key(within: Duration) -> std::io::Result<Option<Action>> {
    if !event::poll(within)? {
        return Ok(None);
    }
    let Event::Key(key) = event::read()? else { return Ok(None) };
    if key.kind != KeyEventKind::Press {
        return Ok(None);
    }
    Ok(match key.code {
        KeyCode::Char('q') | KeyCode::Esc => Some(Action::Quit),
        KeyCode::Char('c') if key.modifiers.contains(KeyModifiers::CONTROL) => Some(Action::Quit),
        KeyCode::Char('s') => Some(Action::Resort),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use ratatui::{Terminal, backend::TestBackend};

    use super::draw;
    use crate::cli::top::view::{ClientRate, Sort, SourceRate, View};

    fn screen(view: &View) -> Vec<String> {
        let mut terminal = Terminal::new(TestBackend::new(78, 14)).expect("test terminal");
        terminal.draw(|f| draw(f, view)).expect("draw");
        let buffer = terminal.backend().buffer();
        let width = usize::from(buffer.area.width);
        buffer.content.chunks(width).map(|row| row.iter().map(|cell| cell.symbol()).collect()).collect()
    }

    #[test]
    fn draws_the_heaviest_sources_and_clients_with_their_rates() {
        let mut view = View {
            interval_secs: 2.0,
            sort: Sort::Rate,
            n: 10,
            sources: Some(vec![
                SourceRate {
                    source: "192.0.2.7".to_owned(),
                    note: None,
                    packets_per_sec: 950.0,
                    drops_per_sec: 850.5,
                    tokens: 0,
                },
                SourceRate {
                    source: "fe80::/64".to_owned(),
                    note: Some("link-local".to_owned()),
                    packets_per_sec: 0.5,
                    drops_per_sec: 0.0,
                    tokens: 100,
                },
            ]),
            clients: Ok(vec![ClientRate {
                client: "ip 203.0.113.9".to_owned(),
                requests_per_sec: 12.5,
                refusals_per_sec: 7.0,
                refused_by: Some("login".to_owned()),
            }]),
        };
        let expected = [
            "limiter top · every 2 s · sorted by rate · s: sort · q: quit                  ",
            "┌kernel layer: heaviest sources──────────────────────────────────────────────┐",
            "│source                             packets/s       drops/s  tokens          │",
            "│192.0.2.7                              950.0         850.5  0               │",
            "│fe80::/64 (link-local)                   0.5           0.0  100             │",
            "│                                                                            │",
            "│                                                                            │",
            "└────────────────────────────────────────────────────────────────────────────┘",
            "┌proxy: heaviest clients─────────────────────────────────────────────────────┐",
            "│client                            requests/s     refused/s  refused by      │",
            "│ip 203.0.113.9                          12.5           7.0  login           │",
            "│                                                                            │",
            "│                                                                            │",
            "└────────────────────────────────────────────────────────────────────────────┘",
        ];
        assert_eq!(screen(&view), expected);

        view.sort_by(Sort::Tokens);
        let tokens = screen(&view);
        assert!(tokens[0].contains("sorted by tokens"), "{tokens:?}");
        assert!(tokens[3].starts_with("│192.0.2.7 "), "fewest tokens first: {tokens:?}");
        assert!(tokens[4].starts_with("│fe80::/64 (link-local) "), "{tokens:?}");
        view.n = 1;
        assert!(screen(&view)[4].starts_with("│     "), "one row left");

        let without = View { sources: None, clients: Err("not configured".to_owned()), ..view };
        let lines = screen(&without);
        assert!(lines[1].starts_with("┌kernel layer: no pinned maps"), "{lines:?}");
        assert!(lines[8].starts_with("┌proxy: not configured"), "{lines:?}");
    }
}
