import Foundation

// MARK: - XML writer

/// Writes the body of an XML property list in CF's layout: tab indentation, and base64 data in
/// lines of 76 − 8 × indent characters (indent counted up to 8).
struct XMLWriter {
    let dropDateFractions: Bool

    static func tabs(_ n: Int, _ out: inout [UInt8]) {
        for _ in 0..<max(n, 0) { out.append(0x09) }
    }

    static func append(_ s: String, _ out: inout [UInt8]) { out.append(contentsOf: s.utf8) }

    static func escaped(_ s: String, _ out: inout [UInt8]) {
        for c in s.utf8 {
            switch c {
            case UInt8(ascii: "<"): append("&lt;", &out)
            case UInt8(ascii: ">"): append("&gt;", &out)
            case UInt8(ascii: "&"): append("&amp;", &out)
            default: out.append(c)
            }
        }
    }

    static func dateText(_ t: Double) -> String {
        guard t.isFinite, t.magnitude < PlistCalendar.calendarLimit else { return RealFormat.cf(t) }
        let p = PlistCalendar.parts(t)
        func two(_ v: Int) -> String { v < 10 ? "0\(v)" : "\(v)" }
        return PlistCalendar.yearText(p.year) + "-" + two(p.month) + "-" + two(p.day) + "T" + two(p.hour)
            + ":"
            + two(p.minute) + ":" + two(p.second) + (p.fraction.isEmpty ? "" : "." + p.fraction) + "Z"
    }

    func write(_ value: PropertyListValue, indent: Int, into out: inout [UInt8]) {
        let tabs = Self.tabs
        let append = Self.append
        let escaped = Self.escaped
        tabs(indent, &out)
        switch value {
        case .string(let s):
            append("<string>", &out)
            escaped(s, &out)
            append("</string>\n", &out)
        case .integer(let i):
            append("<integer>\(i)</integer>\n", &out)
        case .real(let d):
            append("<real>" + RealFormat.cf(d) + "</real>\n", &out)
        case .bool(let b):
            append(b ? "<true/>\n" : "<false/>\n", &out)
        case .date(let t):
            append("<date>" + Self.dateText(dropDateFractions ? t.rounded(.down) : t) + "</date>\n", &out)
        case .data(let d):
            append("<data>\n", &out)
            let lineIndent = min(indent, 8)
            let lineLength = 76 - 8 * lineIndent
            let encoded = Array(d.base64EncodedString().utf8)
            var start = 0
            while start < encoded.count {
                let end = min(start + lineLength, encoded.count)
                tabs(lineIndent, &out)
                out.append(contentsOf: encoded[start..<end])
                out.append(0x0A)
                start = end
            }
            tabs(indent, &out)
            append("</data>\n", &out)
        case .array(let items):
            if items.isEmpty {
                append("<array/>\n", &out)
                return
            }
            append("<array>\n", &out)
            for item in items { write(item, indent: indent + 1, into: &out) }
            tabs(indent, &out)
            append("</array>\n", &out)
        case .dictionary(let entries):
            if entries.isEmpty {
                append("<dict/>\n", &out)
                return
            }
            append("<dict>\n", &out)
            for e in entries {
                tabs(indent + 1, &out)
                append("<key>", &out)
                escaped(e.key, &out)
                append("</key>\n", &out)
                write(e.value, indent: indent + 1, into: &out)
            }
            tabs(indent, &out)
            append("</dict>\n", &out)
        case .uid(let u):
            append("<dict>\n", &out)
            tabs(indent + 1, &out)
            append("<key>CF$UID</key>\n", &out)
            tabs(indent + 1, &out)
            append("<integer>\(u)</integer>\n", &out)
            tabs(indent, &out)
            append("</dict>\n", &out)
        }
    }
}
