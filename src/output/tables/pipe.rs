//! GFM pipe tables made HTML (`--tables html`): a header line, a delimiter line of as many
//! cells (`---`, `:--`, `--:`, `:-:`), then the rows up to a blank line or a line without a
//! `|`, as the GFM spec reads them; outside fenced code blocks. Cells are split at `|` not
//! escaped as `\|`; a row's missing cells are empty and its extra cells dropped (as GFM
//! renders them). Cell text is kept as written.

/// `text` with every pipe table written as an HTML table.
pub fn pipe_to_html(text: &str) -> String {
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let mut out = String::with_capacity(text.len());
    let mut fence: Option<&str> = None;
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let trimmed = line.trim_start();
        match fence {
            Some(f) if trimmed.starts_with(f) => fence = None,
            Some(_) => {}
            None if trimmed.starts_with("```") => fence = Some("```"),
            None if trimmed.starts_with("~~~") => fence = Some("~~~"),
            None => {
                if let Some((html, used)) = table_at(&lines[i..]) {
                    out.push_str(&html);
                    i += used;
                    continue;
                }
            }
        }
        out.push_str(line);
        i += 1;
    }
    out
}

/// The pipe table starting at `lines[0]` as HTML (ending as its last line did) and the number
/// of lines it took; `None` when no table starts there.
fn table_at(lines: &[&str]) -> Option<(String, usize)> {
    let head = cells(lines.first()?).filter(|h| !h.is_empty())?;
    let aligns: Vec<Option<&str>> = cells(lines.get(1)?)?
        .iter()
        .map(|c| alignment(c))
        .collect::<Option<_>>()?;
    if aligns.len() != head.len() {
        return None;
    }
    let mut used = 2;
    let mut html = String::from("<table><thead><tr>");
    row(&mut html, "th", &head, &aligns);
    html.push_str("</tr></thead>");
    let mut body = String::new();
    while let Some(cs) = lines.get(used).and_then(|l| cells(l)) {
        body.push_str("<tr>");
        row(&mut body, "td", &cs, &aligns);
        body.push_str("</tr>");
        used += 1;
    }
    if !body.is_empty() {
        html.push_str(&format!("<tbody>{body}</tbody>"));
    }
    html.push_str("</table>");
    let last = lines[used - 1];
    html.push_str(&last[last.trim_end_matches(['\n', '\r']).len()..]);
    Some((html, used))
}

/// Writes one row's cells (as many as `aligns`, missing ones empty) as `tag` elements.
fn row(out: &mut String, tag: &str, cells: &[String], aligns: &[Option<&str>]) {
    for (i, align) in aligns.iter().enumerate() {
        let text = cells.get(i).map_or("", String::as_str);
        match align {
            Some(a) => out.push_str(&format!("<{tag} align=\"{a}\">{text}</{tag}>")),
            None => out.push_str(&format!("<{tag}>{text}</{tag}>")),
        }
    }
}

/// A delimiter cell's alignment (`Some(None)`: none given); `None` if it is not one.
fn alignment(cell: &str) -> Option<Option<&'static str>> {
    let (left, right) = (cell.starts_with(':'), cell.ends_with(':') && cell.len() > 1);
    let dashes = &cell[usize::from(left)..cell.len() - usize::from(right)];
    if dashes.is_empty() || !dashes.bytes().all(|b| b == b'-') {
        return None;
    }
    Some(match (left, right) {
        (true, true) => Some("center"),
        (true, false) => Some("left"),
        (false, true) => Some("right"),
        (false, false) => None,
    })
}

/// A line's cells, trimmed, `\|` unescaped; `None` for a blank line or one without a `|`.
fn cells(line: &str) -> Option<Vec<String>> {
    let line = line.trim();
    if !line.contains('|') {
        return None;
    }
    let mut cells = Vec::new();
    let mut cell = String::new();
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => {
                cell.push('|');
                chars.next();
            }
            '|' => cells.push(std::mem::take(&mut cell)),
            _ => cell.push(c),
        }
    }
    cells.push(cell);
    // The outer pipes are optional: a leading `|` leaves an empty first cell, a trailing one
    // an empty last cell.
    if line.starts_with('|') {
        cells.remove(0);
    }
    if line.ends_with('|') && !line.ends_with("\\|") && !cells.is_empty() {
        cells.pop();
    }
    Some(cells.into_iter().map(|c| c.trim().to_string()).collect())
}
