//! Small PDFs built in a test: pages of content streams, Form XObjects they draw, Helvetica
//! as `/F1` for text, and a correct xref table.

use std::io::Write;

/// A PDF of `pages` (each a content stream and the entries its stream dictionary adds, e.g.
/// a filter) drawing on `forms` (name, content stream), with a correct xref table.
pub fn pdf(pages: &[(Vec<u8>, &str)], forms: &[(&str, &str)]) -> Vec<u8> {
    pdf_sized(pages, forms, (612, 792))
}

/// [`pdf`] with pages of `size` points (`(72, 72)`: one inch, 200 px rendered at 200 DPI).
pub fn pdf_sized(pages: &[(Vec<u8>, &str)], forms: &[(&str, &str)], (w, h): (u32, u32)) -> Vec<u8> {
    let mut objs: Vec<Vec<u8>> = vec![b"<< /Type /Catalog /Pages 2 0 R >>".to_vec()];
    let n = pages.len();
    let kids: Vec<String> = (0..n).map(|i| format!("{} 0 R", 3 + 2 * i)).collect();
    objs.push(format!("<< /Type /Pages /Kids [{}] /Count {n} >>", kids.join(" ")).into_bytes());
    let first_form = 3 + 2 * n;
    let xobjects: String = (0..forms.len())
        .map(|i| format!("/{} {} 0 R ", forms[i].0, first_form + i))
        .collect();
    // Helvetica as /F1, for pages that show text (a text layer).
    let font = first_form + forms.len();
    let resources = format!("/Resources << /XObject << {xobjects}>> /Font << /F1 {font} 0 R >> >>");
    for (i, (content, dict)) in pages.iter().enumerate() {
        objs.push(
            format!(
                "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 {w} {h}] /Contents {} 0 R \
                 {resources} >>",
                4 + 2 * i
            )
            .into_bytes(),
        );
        objs.push(stream(dict, content));
    }
    for (_, body) in forms {
        let dict = format!("/Type /XObject /Subtype /Form /BBox [0 0 {w} {h}] {resources}");
        objs.push(stream(&dict, body.as_bytes()));
    }
    objs.push(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>".to_vec());
    let mut out = b"%PDF-1.7\n".to_vec();
    let mut offsets = Vec::new();
    for (i, o) in objs.iter().enumerate() {
        offsets.push(out.len());
        writeln!(out, "{} 0 obj", i + 1).unwrap();
        out.extend_from_slice(o);
        out.extend_from_slice(b"\nendobj\n");
    }
    let xref = out.len();
    write!(out, "xref\n0 {}\n0000000000 65535 f \n", objs.len() + 1).unwrap();
    for o in offsets {
        writeln!(out, "{o:010} 00000 n ").unwrap();
    }
    let size = objs.len() + 1;
    write!(
        out,
        "trailer\n<< /Size {size} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n"
    )
    .unwrap();
    out
}

/// A stream object with `dict` entries besides its length.
pub fn stream(dict: &str, data: &[u8]) -> Vec<u8> {
    let mut o = format!("<< {dict} /Length {} >>\nstream\n", data.len()).into_bytes();
    o.extend_from_slice(data);
    o.extend_from_slice(b"\nendstream");
    o
}
