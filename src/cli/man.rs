//! `claudebox manpage`: clap_mangen's sections from the command line's definitions, then
//! FILES, ENVIRONMENT, EXIT STATUS and EXAMPLES rendered from `docs/reference.md`, so the
//! man page and the reference are one text (a section missing there is an error here, and
//! the tests run it).

use anyhow::{anyhow, Result};
use clap::CommandFactory;
use roff::{bold, roman, Roff};

use crate::cli::Cli;

/// The reference the extra sections come from, compiled in.
pub const REFERENCE: &str = include_str!("../../docs/reference.md");

/// The man page's sections taken from the reference: (man heading, reference heading).
pub const SECTIONS: &[(&str, &str)] = &[
    ("FILES", "## Files"),
    ("ENVIRONMENT", "## Environment"),
    ("EXIT STATUS", "## Exit status"),
];

/// The whole man page (roff).
pub fn render() -> Result<Vec<u8>> {
    render_with(REFERENCE)
}

/// The man page with the extra sections taken from `reference`.
pub fn render_with(reference: &str) -> Result<Vec<u8>> {
    let man = clap_mangen::Man::new(Cli::command());
    let mut buf = Vec::new();
    man.render(&mut buf)?;
    let mut roff = Roff::new();
    for (title, heading) in SECTIONS {
        let body = section(reference, heading)
            .ok_or_else(|| anyhow!("docs/reference.md has no `{heading}` section"))?;
        roff.control("SH", [*title]);
        blocks(&mut roff, body);
    }
    let examples = examples(reference)
        .ok_or_else(|| anyhow!("docs/reference.md has no `Examples:` block under `## Options`"))?;
    roff.control("SH", ["EXAMPLES"]);
    code(&mut roff, &examples);
    roff.control("SH", ["SEE ALSO"]);
    roff.text([roman(
        "bwrap(1), claude; docs/ in claudebox's source: reference.md, security.md, network.md, \
         sessions.md, troubleshooting.md",
    )]);
    buf.extend_from_slice(roff.to_roff().as_bytes());
    Ok(buf)
}

/// The text under a `## ` heading, up to the next `## ` heading.
fn section<'a>(md: &'a str, heading: &str) -> Option<&'a str> {
    let start = md.find(&format!("\n{heading}\n"))? + heading.len() + 2;
    let rest = &md[start..];
    Some(rest.find("\n## ").map_or(rest, |end| &rest[..end]))
}

/// The lines of the first code block after `Examples:` in the options section.
fn examples(md: &str) -> Option<Vec<String>> {
    let opts = section(md, "## Options")?;
    let after = &opts[opts.find("Examples:")?..];
    let mut lines = after.lines().skip_while(|l| !l.starts_with("```")).skip(1);
    let mut out = Vec::new();
    for l in lines.by_ref() {
        if l.starts_with("```") {
            return Some(out);
        }
        out.push(l.to_string());
    }
    None
}

/// Markdown inline text as plain text: code spans unquoted, links as their text, `\|` as `|`.
fn plain(s: &str) -> String {
    let s = s.replace("\\|", "|").replace('`', "");
    let mut out = String::new();
    let mut rest = s.as_str();
    while let Some(open) = rest.find('[') {
        let Some(mid) = rest[open..].find("](").map(|m| open + m) else {
            break;
        };
        let Some(close) = rest[mid..].find(')').map(|c| mid + c) else {
            break;
        };
        out.push_str(&rest[..open]);
        out.push_str(&rest[open + 1..mid]);
        rest = &rest[close + 1..];
    }
    out.push_str(rest);
    out
}

/// The cells of a table row (`| a | b \| c |`), split on unescaped bars.
fn cells(row: &str) -> Vec<String> {
    let inner = row.trim().trim_start_matches('|').trim_end_matches('|');
    let mut out = Vec::new();
    let mut cell = String::new();
    let mut chars = inner.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => {
                cell.push_str("\\|");
                chars.next();
            }
            '|' => out.push(std::mem::take(&mut cell)),
            c => cell.push(c),
        }
    }
    out.push(cell);
    out.iter().map(|c| plain(c.trim())).collect()
}

/// A section's paragraphs, tables (a tagged paragraph per row) and code blocks.
fn blocks(roff: &mut Roff, body: &str) {
    let mut para: Vec<&str> = Vec::new();
    let mut in_code: Option<Vec<String>> = None;
    let flush = |roff: &mut Roff, para: &mut Vec<&str>| {
        if !para.is_empty() {
            roff.control("PP", []);
            roff.text([roman(plain(&para.join(" ")))]);
            para.clear();
        }
    };
    let mut header = false;
    for line in body.lines() {
        if let Some(code_lines) = in_code.as_mut() {
            if line.starts_with("```") {
                let done = in_code.take().unwrap_or_default();
                code(roff, &done);
            } else {
                code_lines.push(line.to_string());
            }
            continue;
        }
        if line.starts_with("```") {
            flush(roff, &mut para);
            in_code = Some(Vec::new());
        } else if line.starts_with('|') {
            flush(roff, &mut para);
            if !header {
                header = true; // the header row; the separator row follows
                continue;
            }
            if line.starts_with("| ---") || line.starts_with("|---") {
                continue;
            }
            let c = cells(line);
            roff.control("TP", []);
            roff.text([bold(c.first().cloned().unwrap_or_default())]);
            roff.text([roman(c[1..].join("; "))]);
        } else if line.trim().is_empty() {
            flush(roff, &mut para);
            header = false;
        } else {
            para.push(line.trim());
        }
    }
    flush(roff, &mut para);
}

fn code(roff: &mut Roff, lines: &[String]) {
    roff.control("PP", []);
    roff.control("nf", []);
    for l in lines {
        roff.text([roman(l.as_str())]);
    }
    roff.control("fi", []);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page() -> String {
        String::from_utf8(render().unwrap()).unwrap()
    }

    #[test]
    fn the_page_has_files_environment_exit_status_and_examples() {
        let p = page();
        for h in [
            ".SH FILES",
            ".SH ENVIRONMENT",
            ".SH \"EXIT STATUS\"",
            ".SH EXAMPLES",
        ] {
            assert!(p.contains(h), "{h} missing from:\n{p}");
        }
        // Rows of the reference's tables, as the reference names them.
        for word in [
            "CLAUDEBOX_HOME",
            "XDG_CONFIG_HOME",
            "CLAUDEBOX_INSTANCE_ID",
            "~/.config/claudebox/config.toml",
            "126",
            "claudebox \\-\\-check",
        ] {
            assert!(p.contains(word), "{word} missing from:\n{p}");
        }
        // clap's own sections stay.
        assert!(p.contains(".SH OPTIONS") && p.contains("writable\\-claude\\-setup"));
    }

    #[test]
    fn every_row_of_the_reference_sections_is_in_the_page() {
        let p = page();
        for (_, heading) in SECTIONS {
            for line in section(REFERENCE, heading).unwrap().lines() {
                if line.starts_with("| ") && !line.starts_with("| ---") {
                    let first = cells(line)[0].replace('-', "\\-");
                    assert!(p.contains(&first), "{first} ({heading}) missing");
                }
            }
        }
    }

    /// The control: a reference without one of the sections does not make a page that
    /// silently lacks it.
    #[test]
    fn a_missing_section_is_an_error() {
        for (_, heading) in SECTIONS {
            let cut = REFERENCE.replace(&format!("\n{heading}\n"), "\n## Something else\n");
            let e = render_with(&cut).unwrap_err().to_string();
            assert!(e.contains(heading), "{e}");
        }
        let cut = REFERENCE.replace("Examples:", "Samples:");
        assert!(render_with(&cut).is_err());
    }

    #[test]
    fn markdown_becomes_plain_text() {
        assert_eq!(
            plain("see [Limits](limits.md) and `--pids`"),
            "see Limits and --pids"
        );
        assert_eq!(
            cells("| `a\\|b` | x [y](z.md#w) |"),
            vec!["a|b".to_string(), "x y".to_string()]
        );
    }
}
