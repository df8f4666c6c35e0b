//! Tables in the format asked for (`--tables`, `tables` on `/v1/ocr`).
//!
//! LightOnOCR writes tables as HTML inside its Markdown. [`TableFormat::Markdown`] makes each
//! HTML table a pipe table when a pipe table can say the same thing: rows of `td`/`th` cells
//! with no `rowspan` or `colspan`, at most one header row, no caption or nested table; any
//! other table keeps its HTML. The HTML is read with the [`tl`] parser (tables anywhere in the
//! page, the outermost ones converted). A cell's whitespace collapses as HTML renders it, its
//! inline markup (`<b>`, `<br>`, entities) is kept, and `|` is escaped. A table without a
//! header row gets its first row as the header (a pipe table needs one).
//! [`TableFormat::Html`] does the reverse for GFM pipe tables ([`pipe`]). Text outside the
//! tables is kept byte for byte.

mod pipe;

/// How tables are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TableFormat {
    /// HTML tables (pipe tables the model wrote are converted).
    Html,
    /// Pipe tables where they fit, else HTML.
    Markdown,
}

impl std::str::FromStr for TableFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "html" => Ok(Self::Html),
            "markdown" | "md" => Ok(Self::Markdown),
            _ => Err(format!("{s:?} is not a table format (html or markdown)")),
        }
    }
}

/// `text` with its tables written as `format` says.
pub fn convert(text: &str, format: TableFormat) -> String {
    match format {
        TableFormat::Markdown => html_to_markdown(text),
        TableFormat::Html => pipe::pipe_to_html(text),
    }
}

/// `text` with each outermost HTML table that a pipe table can hold rewritten as one.
///
/// Each table is parsed from its `<table` on (what comes before it, such as a `<` in the
/// prose, cannot swallow it); a table is skipped whole, nested tables with it.
pub fn html_to_markdown(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    let mut from = 0;
    while let Some(start) = next_table(text, from) {
        let Some((end, md)) = table_from(&text[start..]) else {
            from = start + 1;
            continue;
        };
        let end = start + end;
        from = end;
        let Some(md) = md else { continue };
        out.push_str(&text[copied..start]);
        if !out.is_empty() && !out.ends_with('\n') {
            out.push('\n');
        }
        out.push_str(&md);
        if text[end..]
            .chars()
            .next()
            .is_some_and(|c| c != '\n' && c != '\r')
        {
            out.push('\n');
        }
        copied = end;
    }
    out.push_str(&text[copied..]);
    out
}

/// The byte offset of the next `<table` start tag in `text` at or after `from`.
fn next_table(text: &str, from: usize) -> Option<usize> {
    let bytes = text.as_bytes();
    (from..bytes.len().saturating_sub(6)).find(|&i| {
        bytes[i] == b'<'
            && bytes[i + 1..i + 6].eq_ignore_ascii_case(b"table")
            && bytes
                .get(i + 6)
                .is_some_and(|b| *b == b'>' || *b == b'/' || b.is_ascii_whitespace())
    })
}

/// The table at the start of `text`, parsed: where it ends (after its `</table>`) and its
/// pipe table, if one can hold it; `None` when it is not closed by `</table>`.
fn table_from(text: &str) -> Option<(usize, Option<String>)> {
    let dom = tl::parse(text, tl::ParserOptions::default()).ok()?;
    let parser = dom.parser();
    let tag = dom.children().first()?.get(parser)?.as_tag()?;
    let (start, last) = tag.boundaries(parser);
    let end = last + 1;
    let closed = text.get(..end).is_some_and(|t| {
        t.len() >= 8 && t.as_bytes()[t.len() - 8..].eq_ignore_ascii_case(b"</table>")
    });
    (start == 0 && closed).then(|| (end, pipe_table(tag, parser)))
}

/// Whether `tag` is a `name` element (any case).
fn is(tag: &tl::HTMLTag<'_>, name: &str) -> bool {
    tag.name().as_utf8_str().eq_ignore_ascii_case(name)
}

/// The element children of `tag`; `None` when it holds text other than whitespace.
fn element_children<'p, 'a>(
    tag: &'p tl::HTMLTag<'a>,
    parser: &'p tl::Parser<'a>,
) -> Option<Vec<&'p tl::HTMLTag<'a>>> {
    let mut tags = Vec::new();
    for h in tag.children().top().iter() {
        match h.get(parser)? {
            tl::Node::Tag(t) => tags.push(t),
            tl::Node::Raw(r) if r.as_utf8_str().trim().is_empty() => {}
            tl::Node::Raw(_) => return None,
            tl::Node::Comment(_) => {}
        }
    }
    Some(tags)
}

/// A table's rows (cells' text), the header (if any) first; `None` when a pipe table cannot
/// hold it (more than one header row, a header row after others, other elements).
fn rows(table: &tl::HTMLTag<'_>, parser: &tl::Parser<'_>) -> Option<Vec<Vec<String>>> {
    let mut rows = Vec::new();
    let mut head_rows = 0;
    for child in element_children(table, parser)? {
        let (trs, head) = if is(child, "tr") {
            (vec![child], false)
        } else if is(child, "thead") || is(child, "tbody") || is(child, "tfoot") {
            (element_children(child, parser)?, is(child, "thead"))
        } else {
            return None;
        };
        for tr in trs {
            if !is(tr, "tr") {
                return None;
            }
            let cells = element_children(tr, parser)?;
            let all_th = !cells.is_empty() && cells.iter().all(|c| is(c, "th"));
            if head || (rows.is_empty() && all_th) {
                head_rows += 1;
                if head_rows > 1 || !rows.is_empty() {
                    return None;
                }
            }
            rows.push(
                cells
                    .into_iter()
                    .map(|c| cell_text(c, parser))
                    .collect::<Option<Vec<_>>>()?,
            );
        }
    }
    (!rows.is_empty()).then_some(rows)
}

/// A `td`/`th` cell's content for a pipe table; `None` for another element, a span, or
/// table structure inside it.
fn cell_text(cell: &tl::HTMLTag<'_>, parser: &tl::Parser<'_>) -> Option<String> {
    if !(is(cell, "td") || is(cell, "th")) {
        return None;
    }
    for span in ["rowspan", "colspan"] {
        if let Some(v) = cell.attributes().get(span) {
            if v.is_none_or(|v| v.as_utf8_str().trim() != "1") {
                return None;
            }
        }
    }
    let nested = cell.children().all(parser).iter().any(|n| {
        n.as_tag()
            .is_some_and(|t| ["table", "tr", "td", "th"].iter().any(|s| is(t, s)))
    });
    if nested {
        return None;
    }
    let html = cell.inner_html(parser);
    let collapsed = html.split_whitespace().collect::<Vec<_>>().join(" ");
    Some(collapsed.replace('|', "\\|"))
}

/// `table` as a pipe table (lines ending in `\n` but the last); `None` when it cannot be.
fn pipe_table(table: &tl::HTMLTag<'_>, parser: &tl::Parser<'_>) -> Option<String> {
    let rows = rows(table, parser)?;
    let width = rows.iter().map(Vec::len).max()?.max(1);
    let line = |cells: &[String]| {
        let mut s = String::from("|");
        for i in 0..width {
            let c = cells.get(i).map_or("", String::as_str);
            s.push(' ');
            s.push_str(c);
            s.push_str(if c.is_empty() { "|" } else { " |" });
        }
        s
    };
    let mut lines = vec![line(&rows[0]), line(&vec!["---".to_string(); width])];
    lines.extend(rows[1..].iter().map(|r| line(r)));
    Some(lines.join("\n"))
}

#[cfg(test)]
mod tests;
