import Foundation

// MARK: - describe

/// `plutil -p`'s text for a value.
enum Describer {
    static func quoted(_ s: String) -> String {
        var out = "\""
        for u in s.unicodeScalars {
            switch u {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\t": out += "\\t"
            case "\r": out += "\\r"
            default:
                if u.value < 0x20 || u.value == 0x7F {
                    out += "\\u{" + String(u.value, radix: 16) + "}"
                } else {
                    out.unicodeScalars.append(u)
                }
            }
        }
        return out + "\""
    }

    static func hexBytes<S: Sequence>(_ bytes: S) -> String where S.Element == UInt8 {
        var s = ""
        for byte in bytes {
            s += byte < 16 ? "0" + String(byte, radix: 16) : String(byte, radix: 16)
        }
        return s
    }

    static func dateText(_ t: Double) -> String {
        guard t.isFinite, t.magnitude < PlistCalendar.calendarLimit else {
            return "date(\(t) s since 2001-01-01)"
        }
        let p = PlistCalendar.parts(t)
        func two(_ v: Int) -> String { v < 10 ? "0\(v)" : "\(v)" }
        return PlistCalendar.yearText(p.year) + "-" + two(p.month) + "-" + two(p.day) + " " + two(p.hour)
            + ":"
            + two(p.minute) + ":" + two(p.second) + (p.fraction.isEmpty ? "" : "." + p.fraction) + " +0000"
    }

    static func describe(_ v: PropertyListValue, level: Int, into out: inout String) {
        let pad = String(repeating: "  ", count: level + 1)
        let closePad = String(repeating: "  ", count: level)
        switch v {
        case .string(let s): out += quoted(s)
        case .integer(let i): out += String(i)
        case .real(let d): out += d.description
        case .bool(let b): out += b ? "true" : "false"
        case .date(let t): out += dateText(t)
        case .data(let d):
            if d.count <= 32 {
                out += "{length = \(d.count), bytes = 0x\(hexBytes(d))}"
            } else {
                out +=
                    "{length = \(d.count), bytes = 0x\(hexBytes(d.prefix(16))) ... \(hexBytes(d.suffix(8)))}"
            }
        case .uid(let u): out += "<CFKeyedArchiverUID>{value = \(u)}"
        case .array(let items):
            if items.isEmpty {
                out += "[]"
                return
            }
            out += "[\n"
            for (i, item) in items.enumerated() {
                out += pad + "\(i) => "
                describe(item, level: level + 1, into: &out)
                out += "\n"
            }
            out += closePad + "]"
        case .dictionary(let entries):
            if entries.isEmpty {
                out += "{}"
                return
            }
            out += "{\n"
            for e in entries {
                out += pad + quoted(e.key) + " => "
                describe(e.value, level: level + 1, into: &out)
                out += "\n"
            }
            out += closePad + "}"
        }
    }
}
