use super::*;

#[test]
fn a_simple_table_becomes_a_pipe_table_with_its_first_row_as_header() {
    let html = "<table><tr><td>a</td><td>b</td></tr><tr><td>1</td><td>2</td></tr></table>";
    assert_eq!(
        html_to_markdown(html),
        "| a | b |\n| --- | --- |\n| 1 | 2 |"
    );
}

#[test]
fn a_header_row_in_thead_or_of_th_cells_heads_the_pipe_table() {
    let html = "<table>\n  <thead><tr><th>Name</th><th>Qty</th></tr></thead>\n  <tbody>\n    \
                <tr><td>Apples</td><td>3</td></tr>\n    <tr><td>Pears</td><td>10</td></tr>\n  \
                </tbody>\n</table>";
    let want = "| Name | Qty |\n| --- | --- |\n| Apples | 3 |\n| Pears | 10 |";
    assert_eq!(html_to_markdown(html), want);
    let th = "<TABLE><TR><TH>Name</TH><TH>Qty</TH></TR><TR><TD>Apples</TD><TD>3</TD></TR></TABLE>";
    assert_eq!(
        html_to_markdown(th),
        "| Name | Qty |\n| --- | --- |\n| Apples | 3 |"
    );
}

#[test]
fn pipes_are_escaped_whitespace_collapses_and_inline_markup_stays() {
    let html = "<table><tr><th>a | b</th><th>x</th></tr>\
                <tr><td>line one\n  line two</td><td><b>bold</b><br>&amp; more</td></tr>\
                <tr><td></td><td>only</td></tr></table>";
    assert_eq!(
        html_to_markdown(html),
        "| a \\| b | x |\n| --- | --- |\n| line one line two | <b>bold</b><br>&amp; more |\n\
         | | only |"
    );
}

#[test]
fn ragged_rows_are_padded_to_the_widest() {
    let html = "<table><tr><td>a</td></tr><tr><td>1</td><td>2</td><td>3</td></tr></table>";
    assert_eq!(
        html_to_markdown(html),
        "| a | | |\n| --- | --- | --- |\n| 1 | 2 | 3 |"
    );
}

#[test]
fn tables_with_spans_captions_nesting_or_two_header_rows_keep_their_html() {
    for html in [
        "<table><tr><td rowspan=\"2\">a</td><td>b</td></tr><tr><td>c</td></tr></table>",
        "<table><tr><th colspan=2>Head</th></tr><tr><td>1</td><td>2</td></tr></table>",
        "<table><caption>T</caption><tr><td>1</td></tr></table>",
        "<table><tr><td><table><tr><td>in</td></tr></table></td></tr></table>",
        "<table><thead><tr><th>a</th></tr><tr><th>b</th></tr></thead><tr><td>1</td></tr></table>",
        "<table>loose text<tr><td>1</td></tr></table>",
        "<table></table>",
        "<table><tr><td>unclosed</td></tr>",
    ] {
        assert_eq!(html_to_markdown(html), html, "{html}");
    }
    // A span of 1 is no span.
    assert_eq!(
        html_to_markdown("<table><tr><td colspan=\"1\">a</td></tr></table>"),
        "| a |\n| --- |"
    );
}

#[test]
fn text_around_tables_is_untouched_and_each_table_decided_alone() {
    let text = "# Report\n\nPrices < 5 & more *here*.\n\n\
                <table><tr><td>a</td><td>b</td></tr></table>\n\nBetween.\n\n\
                <table><tr><td colspan=\"2\">wide</td></tr></table>\n\n![image](image_1.png) 1,2,3,4\n";
    assert_eq!(
        html_to_markdown(text),
        "# Report\n\nPrices < 5 & more *here*.\n\n| a | b |\n| --- | --- |\n\nBetween.\n\n\
         <table><tr><td colspan=\"2\">wide</td></tr></table>\n\n![image](image_1.png) 1,2,3,4\n"
    );
    // A table inside a line is put on lines of its own.
    assert_eq!(
        html_to_markdown("see <table><tr><td>x</td></tr></table> here"),
        "see \n| x |\n| --- |\n here"
    );
    let plain = "No tables | here\n\n- a list\n";
    assert_eq!(html_to_markdown(plain), plain);
}

#[test]
fn pipe_tables_become_html_with_their_alignment() {
    let text = "Intro\n\n| Name | Qty | Note |\n|:-----|----:|:---:|\n| Apples | 3 | a \\| b |\n\
                | Pears |\n\nAfter | not a table\n";
    assert_eq!(
        pipe::pipe_to_html(text),
        "Intro\n\n<table><thead><tr><th align=\"left\">Name</th><th align=\"right\">Qty</th>\
         <th align=\"center\">Note</th></tr></thead><tbody><tr><td align=\"left\">Apples</td>\
         <td align=\"right\">3</td><td align=\"center\">a | b</td></tr><tr><td align=\"left\">\
         Pears</td><td align=\"right\"></td><td align=\"center\"></td></tr></tbody></table>\n\n\
         After | not a table\n"
    );
    // No outer pipes, no body; a fenced block is left alone; a delimiter of another width
    // is not a table.
    assert_eq!(
        pipe::pipe_to_html("a | b\n--- | ---"),
        "<table><thead><tr><th>a</th><th>b</th></tr></thead></table>"
    );
    for text in [
        "```\n| a |\n| - |\n```\n",
        "| a | b |\n| --- |\n",
        "| a |\n| x |\n",
    ] {
        assert_eq!(pipe::pipe_to_html(text), text);
    }
}

#[test]
fn the_two_directions_agree_and_parse_from_flags() {
    let md = "| a | b |\n| --- | --- |\n| 1 | 2 |";
    assert_eq!(
        convert(&convert(md, TableFormat::Html), TableFormat::Markdown),
        md
    );
    assert_eq!("markdown".parse(), Ok(TableFormat::Markdown));
    assert_eq!("html".parse(), Ok(TableFormat::Html));
    assert!("pdf"
        .parse::<TableFormat>()
        .unwrap_err()
        .contains("html or markdown"));
}

#[test]
fn text_that_is_not_utf8_aligned_or_not_a_table_start_is_safe() {
    for text in [
        "é<table>é",
        "<tables>",
        "x <tablé",
        "<table><tr><td>ü</td></tr></table>é",
    ] {
        let _ = html_to_markdown(text);
    }
    assert_eq!(
        html_to_markdown("<table><tr><td>ü</td></tr></table>é"),
        "| ü |\n| --- |\né"
    );
}
