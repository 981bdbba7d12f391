//! `solofs bench --plot FILE.png`: bar charts of ops/s and p50 latency per
//! phase and target, drawn into an RGB bitmap and written as PNG by the
//! `png` crate.

/// One target's values in a group: (ops/s, p50 µs).
pub type Pair = (Option<f64>, Option<f64>);

/// One bar group: a phase, and per target (ops/s, p50 µs).
pub struct Group {
    pub phase: String,
    pub values: Vec<Pair>,
}

const W: usize = 1000;
const H: usize = 620;
const COLORS: [[u8; 3]; 6] = [
    [31, 119, 180],
    [255, 127, 14],
    [44, 160, 44],
    [214, 39, 40],
    [148, 103, 189],
    [140, 86, 75],
];

struct Canvas {
    px: Vec<u8>,
}

impl Canvas {
    fn new() -> Canvas {
        Canvas {
            px: vec![255; W * H * 3],
        }
    }
    fn rect(&mut self, x0: usize, y0: usize, x1: usize, y1: usize, c: [u8; 3]) {
        for y in y0.min(H)..y1.min(H) {
            for x in x0.min(W)..x1.min(W) {
                self.px[(y * W + x) * 3..(y * W + x) * 3 + 3].copy_from_slice(&c);
            }
        }
    }
    fn text(&mut self, mut x: usize, y: usize, s: &str, c: [u8; 3]) {
        for ch in s.chars() {
            let g = glyph(ch);
            for (row, bits) in g.iter().enumerate() {
                for col in 0..5 {
                    if bits & (0x10 >> col) != 0 {
                        self.rect(x + col, y + row, x + col + 1, y + row + 1, c);
                    }
                }
            }
            x += 6;
        }
    }
}

/// 5x7 glyphs (rows top to bottom, bit 4 = leftmost column).
fn glyph(c: char) -> [u8; 7] {
    match c {
        'A' => [14, 17, 17, 31, 17, 17, 17],
        'B' => [30, 17, 17, 30, 17, 17, 30],
        'C' => [14, 17, 16, 16, 16, 17, 14],
        'D' => [28, 18, 17, 17, 17, 18, 28],
        'E' => [31, 16, 16, 30, 16, 16, 31],
        'F' => [31, 16, 16, 30, 16, 16, 16],
        'G' => [14, 17, 16, 23, 17, 17, 15],
        'H' => [17, 17, 17, 31, 17, 17, 17],
        'I' => [14, 4, 4, 4, 4, 4, 14],
        'J' => [7, 2, 2, 2, 2, 18, 12],
        'K' => [17, 18, 20, 24, 20, 18, 17],
        'L' => [16, 16, 16, 16, 16, 16, 31],
        'M' => [17, 27, 21, 21, 17, 17, 17],
        'N' => [17, 17, 25, 21, 19, 17, 17],
        'O' => [14, 17, 17, 17, 17, 17, 14],
        'P' => [30, 17, 17, 30, 16, 16, 16],
        'Q' => [14, 17, 17, 17, 21, 18, 13],
        'R' => [30, 17, 17, 30, 20, 18, 17],
        'S' => [15, 16, 16, 14, 1, 1, 30],
        'T' => [31, 4, 4, 4, 4, 4, 4],
        'U' => [17, 17, 17, 17, 17, 17, 14],
        'V' => [17, 17, 17, 17, 17, 10, 4],
        'W' => [17, 17, 17, 21, 21, 21, 10],
        'X' => [17, 17, 10, 4, 10, 17, 17],
        'Y' => [17, 17, 10, 4, 4, 4, 4],
        'Z' => [31, 1, 2, 4, 8, 16, 31],
        '%' => [24, 25, 2, 4, 8, 19, 3],
        '+' => [0, 4, 4, 31, 4, 4, 0],
        '[' => [14, 8, 8, 8, 8, 8, 14],
        ']' => [14, 2, 2, 2, 2, 2, 14],
        '<' => [2, 4, 8, 16, 8, 4, 2],
        '>' => [8, 4, 2, 1, 2, 4, 8],
        '0' => [14, 17, 19, 21, 25, 17, 14],
        '1' => [4, 12, 4, 4, 4, 4, 14],
        '2' => [14, 17, 1, 2, 4, 8, 31],
        '3' => [31, 2, 4, 2, 1, 17, 14],
        '4' => [2, 6, 10, 18, 31, 2, 2],
        '5' => [31, 16, 30, 1, 1, 17, 14],
        '6' => [6, 8, 16, 30, 17, 17, 14],
        '7' => [31, 1, 2, 4, 8, 8, 8],
        '8' => [14, 17, 17, 14, 17, 17, 14],
        '9' => [14, 17, 17, 15, 1, 2, 12],
        'a' => [0, 0, 14, 1, 15, 17, 15],
        'b' => [16, 16, 22, 25, 17, 17, 30],
        'c' => [0, 0, 14, 16, 16, 17, 14],
        'd' => [1, 1, 13, 19, 17, 17, 15],
        'e' => [0, 0, 14, 17, 31, 16, 14],
        'f' => [6, 9, 8, 28, 8, 8, 8],
        'g' => [0, 15, 17, 17, 15, 1, 14],
        'h' => [16, 16, 22, 25, 17, 17, 17],
        'i' => [4, 0, 12, 4, 4, 4, 14],
        'j' => [2, 0, 6, 2, 2, 18, 12],
        'k' => [16, 16, 18, 20, 24, 20, 18],
        'l' => [12, 4, 4, 4, 4, 4, 14],
        'm' => [0, 0, 26, 21, 21, 17, 17],
        'n' => [0, 0, 22, 25, 17, 17, 17],
        'o' => [0, 0, 14, 17, 17, 17, 14],
        'p' => [0, 0, 30, 17, 30, 16, 16],
        'q' => [0, 0, 13, 19, 15, 1, 1],
        'r' => [0, 0, 22, 25, 16, 16, 16],
        's' => [0, 0, 14, 16, 14, 1, 30],
        't' => [8, 8, 28, 8, 8, 9, 6],
        'u' => [0, 0, 17, 17, 17, 19, 13],
        'v' => [0, 0, 17, 17, 17, 10, 4],
        'w' => [0, 0, 17, 17, 21, 21, 10],
        'x' => [0, 0, 17, 10, 4, 10, 17],
        'y' => [0, 0, 17, 17, 15, 1, 14],
        'z' => [0, 0, 31, 2, 4, 8, 31],
        '-' => [0, 0, 0, 31, 0, 0, 0],
        '.' => [0, 0, 0, 0, 0, 12, 12],
        ':' => [0, 12, 12, 0, 12, 12, 0],
        '/' => [0, 1, 2, 4, 8, 16, 0],
        '(' => [2, 4, 8, 8, 8, 4, 2],
        ')' => [8, 4, 2, 2, 2, 4, 8],
        ',' => [0, 0, 0, 0, 12, 4, 8],
        '_' => [0, 0, 0, 0, 0, 0, 31],
        '=' => [0, 0, 31, 0, 31, 0, 0],
        _ => [0; 7],
    }
}

/// A value in at most 4 characters and 3 significant digits: `0.5`,
/// `52`, `999`, `1.2k`, `15k`, `150k`, `1.5M`.
fn fmt_si(v: f64) -> String {
    let (x, suffix) = if v >= 1e9 {
        (v / 1e9, "G")
    } else if v >= 1e6 {
        (v / 1e6, "M")
    } else if v >= 1e3 {
        (v / 1e3, "k")
    } else {
        (v, "")
    };
    let digits = if x >= 10.0 || (suffix.is_empty() && x >= 1.0 && x.fract() == 0.0) {
        0
    } else {
        1
    };
    let s = format!("{x:.digits$}");
    // (Rounding may carry into the next unit's range: 999.6 -> 1000.)
    let s = s.strip_suffix(".0").map_or(s.clone(), str::to_string);
    format!("{s}{suffix}")
}

/// The values a log axis from 10^`lo` to 10^`hi` marks: every 1, 2 and 5
/// while it spans few decades, every decade beyond.
fn ticks(lo: f64, hi: f64) -> Vec<f64> {
    let steps: &[f64] = if hi - lo <= 3.0 {
        &[1.0, 2.0, 5.0]
    } else {
        &[1.0]
    };
    (lo as i32..=hi as i32)
        .flat_map(|e| steps.iter().map(move |s| s * 10f64.powi(e)))
        .filter(|v| v.log10() <= hi + 1e-9)
        .collect()
}

/// `name` cut into lines of at most `width` characters, at `-`, `_` or
/// spaces where it can (nothing is dropped).
fn wrap(name: &str, width: usize) -> Vec<String> {
    let width = width.max(1);
    let mut lines = Vec::new();
    let mut rest = name;
    while rest.chars().count() > width {
        let head: String = rest.chars().take(width).collect();
        let cut = head
            .rfind(['-', '_', ' '])
            .map(|i| i + 1)
            .filter(|&i| i > 1)
            .unwrap_or(head.len());
        lines.push(rest[..cut].to_string());
        rest = &rest[cut..];
    }
    lines.push(rest.to_string());
    lines
}

/// Draws one log-scale panel of bars (values per group per target).
fn panel(
    cv: &mut Canvas,
    top: usize,
    height: usize,
    title: &str,
    groups: &[Group],
    get: &dyn Fn(&Pair) -> Option<f64>,
) {
    let vals: Vec<f64> = groups
        .iter()
        .flat_map(|g| g.values.iter().filter_map(get))
        .filter(|v| *v > 0.0)
        .collect();
    cv.text(60, top, title, [0, 0, 0]);
    if vals.is_empty() {
        return;
    }
    let lo = vals
        .iter()
        .cloned()
        .fold(f64::MAX, f64::min)
        .log10()
        .floor();
    let hi = vals
        .iter()
        .cloned()
        .fold(0.0, f64::max)
        .log10()
        .ceil()
        .max(lo + 1.0);
    let (x0, x1, y0, y1) = (60usize, W - 20, top + 14, top + height - 24);
    let ypos = |v: f64| y1 - (((v.log10() - lo) / (hi - lo)) * (y1 - y0) as f64) as usize;
    for v in ticks(lo, hi) {
        let y = ypos(v);
        let decade = (v.log10() - v.log10().round()).abs() < 1e-9;
        let shade = if decade { 200 } else { 235 };
        cv.rect(x0, y, x1, y + 1, [shade, shade, shade]);
        cv.text(4, y.saturating_sub(3), &fmt_si(v), [80, 80, 80]);
    }
    cv.rect(x0, y0, x0 + 1, y1, [0, 0, 0]);
    cv.rect(x0, y1, x1, y1 + 1, [0, 0, 0]);
    let n = groups.len().max(1);
    let gw = (x1 - x0) / n;
    let targets = groups
        .iter()
        .map(|g| g.values.len())
        .max()
        .unwrap_or(1)
        .max(1);
    let bw = (gw.saturating_sub(10) / targets).max(1);
    for (gi, g) in groups.iter().enumerate() {
        let gx = x0 + gi * gw + 5;
        for (ti, v) in g.values.iter().enumerate() {
            if let Some(v) = get(v).filter(|v| *v > 0.0) {
                let y = ypos(v.max(10f64.powf(lo)));
                let bx = gx + ti * bw;
                cv.rect(bx, y, bx + bw - 1, y1, COLORS[ti % COLORS.len()]);
                // Its value above it: across if it fits, else one
                // character under the other.
                let label = fmt_si(v);
                if label.len() * 6 <= bw + 2 {
                    cv.text(bx, y.saturating_sub(9).max(y0), &label, [0, 0, 0]);
                } else {
                    let top = y.saturating_sub(8 * label.len() + 1).max(y0);
                    for (k, ch) in label.chars().enumerate() {
                        cv.text(
                            bx + bw.saturating_sub(5) / 2,
                            top + 8 * k,
                            &ch.to_string(),
                            [0, 0, 0],
                        );
                    }
                }
            }
        }
        for (k, line) in wrap(&g.phase, (gw / 6).max(1)).iter().enumerate().take(2) {
            cv.text(gx, y1 + 6 + 9 * k, line, [0, 0, 0]);
        }
    }
}

/// Renders the chart as PNG bytes.
pub fn render(
    title: &str,
    labels: &[String],
    groups: &[Group],
) -> Result<Vec<u8>, png::EncodingError> {
    let mut cv = Canvas::new();
    cv.text(10, 8, title, [0, 0, 0]);
    for (i, l) in labels.iter().enumerate() {
        let x = 10 + i * 330;
        cv.rect(x, 24, x + 10, 34, COLORS[i % COLORS.len()]);
        cv.text(x + 14, 26, l, [0, 0, 0]);
    }
    panel(
        &mut cv,
        44,
        290,
        "operations per second (log scale)",
        groups,
        &|v| v.0,
    );
    panel(
        &mut cv,
        336,
        280,
        "p50 latency per call, microseconds (log scale)",
        groups,
        &|v| v.1,
    );
    png(W, H, &cv.px)
}

/// Encodes RGB pixels as PNG (the `png` crate).
pub fn png(w: usize, h: usize, rgb: &[u8]) -> Result<Vec<u8>, png::EncodingError> {
    let mut out = Vec::new();
    let mut e = png::Encoder::new(&mut out, w as u32, h as u32);
    e.set_color(png::ColorType::Rgb);
    e.set_depth(png::BitDepth::Eight);
    let mut wr = e.write_header()?;
    wr.write_image_data(rgb)?;
    wr.finish()?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chart_decodes_to_its_pixels() {
        let px = [255, 0, 0, 0, 0, 255];
        let p = png(2, 1, &px).unwrap();
        let mut r = png::Decoder::new(std::io::Cursor::new(&p))
            .read_info()
            .unwrap();
        let mut buf = vec![0; r.output_buffer_size().unwrap()];
        let info = r.next_frame(&mut buf).unwrap();
        assert_eq!((info.width, info.height), (2, 1));
        assert_eq!(info.color_type, png::ColorType::Rgb);
        assert_eq!(&buf[..info.buffer_size()], &px);
        // A whole chart: the size asked, and the title's black pixels.
        let c = render("t", &["a".into()], &[]).unwrap();
        let mut r = png::Decoder::new(std::io::Cursor::new(&c))
            .read_info()
            .unwrap();
        let mut buf = vec![0; r.output_buffer_size().unwrap()];
        let info = r.next_frame(&mut buf).unwrap();
        assert_eq!((info.width, info.height), (W as u32, H as u32));
        assert!(buf.chunks(3).any(|p| p == [0, 0, 0]));
    }

    #[test]
    fn values_ticks_and_names_read_whole() {
        let f: Vec<String> = [0.5, 52.0, 999.0, 1234.0, 14_900.0, 150_000.0, 1_500_000.0]
            .iter()
            .map(|&v| fmt_si(v))
            .collect();
        assert_eq!(f, ["0.5", "52", "999", "1.2k", "15k", "150k", "1.5M"]);
        assert_eq!(
            ticks(1.0, 3.0),
            [10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0]
        );
        assert_eq!(ticks(0.0, 5.0).len(), 6);
        assert_eq!(wrap("rename-across", 8), ["rename-", "across"]);
        assert_eq!(wrap("stat", 8), ["stat"]);
        assert_eq!(wrap("abcdefghij", 4).concat(), "abcdefghij");
        // Upper case has glyphs of its own.
        assert_ne!(glyph('A'), glyph('a'));
        assert_ne!(glyph('S'), [0; 7]);
    }
}
