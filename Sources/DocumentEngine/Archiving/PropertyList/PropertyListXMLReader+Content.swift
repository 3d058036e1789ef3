import Foundation

// MARK: - XML reader: element contents

// The text inside `<string>`, `<key>`, `<integer>`, `<real>`, `<date>` and `<data>`: entities,
// CDATA, and each scalar's syntax. The markup and the structure around them are in
// PropertyListXMLReader.swift.
extension XMLReader {
    /// Character data of a <string>/<key>-like element up to its end tag: entities, CDATA
    /// sections and comments are handled, any other markup is an error.
    mutating func text(_ tag: Tag) throws(PropertyListError) -> String {
        if tag.selfClosing { return "" }
        // Fast path: plain text straight up to the end tag.
        var run = p
        while run < b.count && b[run] != UInt8(ascii: "<") && b[run] != UInt8(ascii: "&") { run += 1 }
        if has("</", at: run), let (n, e) = name(at: run + 2), n == tag.name, e < b.count,
            b[e] == UInt8(ascii: ">")
        {
            if let bad = invalidUTF8(p, run) { throw error("invalid UTF-8 in <\(tag.name)>", at: bad) }
            let s = String(decoding: b[p..<run], as: UTF8.self)
            p = e + 1
            return s
        }
        var out: [UInt8] = []
        while true {
            var run = p
            while run < b.count && b[run] != UInt8(ascii: "<") && b[run] != UInt8(ascii: "&") { run += 1 }
            if run > p {
                if let bad = invalidUTF8(p, run) { throw error("invalid UTF-8 in <\(tag.name)>", at: bad) }
                out.append(contentsOf: b[p..<run])
                p = run
            }
            guard p < b.count else {
                throw error("unexpected end of input, expected </\(tag.name)>", at: p)
            }
            if b[p] == UInt8(ascii: "&") {
                try entity(into: &out)
            } else if has("<![CDATA[", at: p) {
                guard let end = find("]]>", from: p + 9) else {
                    throw error("unterminated CDATA section", at: p)
                }
                if let bad = invalidUTF8(p + 9, end) {
                    throw error("invalid UTF-8 in <\(tag.name)>", at: bad)
                }
                out.append(contentsOf: b[(p + 9)..<end])
                p = end + 3
            } else if has("<!--", at: p) {
                guard let end = find("-->", from: p + 4) else { throw error("unterminated comment", at: p) }
                p = end + 3
            } else if has("</", at: p) {
                let at = p
                let n = try endTag()
                guard n == tag.name else { throw error("expected </\(tag.name)>, found </\(n)>", at: at) }
                return String(decoding: out, as: UTF8.self)
            } else {
                throw error("expected </\(tag.name)>, found \(found(at: p))", at: p)
            }
        }
    }

    mutating func entity(into out: inout [UInt8]) throws(PropertyListError) {
        let start = p
        var e = p + 1
        while e < b.count && e - p <= 12 && b[e] != UInt8(ascii: ";") && b[e] != UInt8(ascii: "<")
            && !Self.isSpace(b[e])
        { e += 1 }
        guard e < b.count, b[e] == UInt8(ascii: ";") else {
            throw error("'&' not followed by an entity name and ';' (write &amp;)", at: start)
        }
        let name = String(decoding: b[(p + 1)..<e], as: UTF8.self)
        p = e + 1
        switch name {
        case "lt": out.append(UInt8(ascii: "<"))
        case "gt": out.append(UInt8(ascii: ">"))
        case "amp": out.append(UInt8(ascii: "&"))
        case "quot": out.append(UInt8(ascii: "\""))
        case "apos": out.append(UInt8(ascii: "'"))
        default:
            var scalar: UInt32? = nil
            if name.hasPrefix("#x") || name.hasPrefix("#X") {
                let digits = name.dropFirst(2)
                if !digits.isEmpty, digits.allSatisfy(\.isHexDigit) { scalar = UInt32(digits, radix: 16) }
            } else if name.hasPrefix("#") {
                let digits = name.dropFirst()
                if !digits.isEmpty, digits.allSatisfy({ $0.isASCII && $0.isNumber }) {
                    scalar = UInt32(digits)
                }
            } else {
                throw error("unknown entity &\(name);", at: start)
            }
            guard let s = scalar, let u = Unicode.Scalar(s) else {
                throw error("invalid character reference &\(name);", at: start)
            }
            out.append(contentsOf: String(Character(u)).utf8)
        }
    }

    mutating func integer(_ tag: Tag) throws(PropertyListError) -> PropertyListValue {
        let at = p
        let s = try text(tag)
        guard !s.isEmpty else { throw error("empty <integer>", at: at) }
        var chars = Substring(s)
        var negative = false
        if chars.first == "-" || chars.first == "+" {
            negative = chars.first == "-"
            chars = chars.dropFirst()
        }
        var radix: UInt64 = 10
        if chars.hasPrefix("0x") || chars.hasPrefix("0X") {
            radix = 16
            chars = chars.dropFirst(2)
        }
        var magnitude: UInt64 = 0
        var overflow = false
        guard !chars.isEmpty else { throw error("bad integer \"\(Self.clip(s))\"", at: at) }
        for c in chars.unicodeScalars {
            guard let d = Self.digit(c), d < radix else {
                throw error("bad integer \"\(Self.clip(s))\"", at: at)
            }
            let (m1, o1) = magnitude.multipliedReportingOverflow(by: radix)
            let (m2, o2) = m1.addingReportingOverflow(d)
            if o1 || o2 { overflow = true }
            magnitude = m2
        }
        if overflow || (negative && magnitude > UInt64(1) << 63) {
            throw error("integer \(Self.clip(s)) out of range (Int64.min...UInt64.max)", at: at)
        }
        return .integer(negative ? -Int128(magnitude) : Int128(magnitude))
    }

    static func digit(_ c: Unicode.Scalar) -> UInt64? {
        switch c.value {
        case 0x30...0x39: return UInt64(c.value - 0x30)
        case 0x61...0x66: return UInt64(c.value - 0x61 + 10)
        case 0x41...0x46: return UInt64(c.value - 0x41 + 10)
        default: return nil
        }
    }

    static func clip(_ s: String) -> String { s.count > 40 ? String(s.prefix(40)) + "…" : s }

    /// CF's real syntax: decimal with optional exponent, or inf/infinity/nan (any case, optional sign).
    static func parseReal(_ s: Substring) -> Double? {
        var body = s
        var sign = ""
        if body.first == "-" || body.first == "+" {
            sign = String(body.first ?? "+")
            body = body.dropFirst()
        }
        switch body.lowercased() {
        case "inf", "infinity": return sign == "-" ? -.infinity : .infinity
        case "nan": return .nan
        default: break
        }
        // [digits][.digits][e[+-]digits], at least one digit in the mantissa
        var i = body.startIndex
        var mantissaDigits = 0
        while i < body.endIndex, body[i].isASCII, body[i].isNumber {
            i = body.index(after: i)
            mantissaDigits += 1
        }
        if i < body.endIndex, body[i] == "." {
            i = body.index(after: i)
            while i < body.endIndex, body[i].isASCII, body[i].isNumber {
                i = body.index(after: i)
                mantissaDigits += 1
            }
        }
        guard mantissaDigits > 0 else { return nil }
        if i < body.endIndex, body[i] == "e" || body[i] == "E" {
            i = body.index(after: i)
            if i < body.endIndex, body[i] == "+" || body[i] == "-" { i = body.index(after: i) }
            var expDigits = 0
            while i < body.endIndex, body[i].isASCII, body[i].isNumber {
                i = body.index(after: i)
                expDigits += 1
            }
            guard expDigits > 0 else { return nil }
        }
        guard i == body.endIndex else { return nil }
        return Double(sign + body)
    }

    mutating func real(_ tag: Tag) throws(PropertyListError) -> PropertyListValue {
        let at = p
        let s = try text(tag)
        // CF (strtod) tolerates leading whitespace.
        let trimmed = s.drop { $0 == " " || $0 == "\t" || $0 == "\n" || $0 == "\r" }
        guard let d = Self.parseReal(trimmed) else {
            throw error(s.isEmpty ? "empty <real>" : "bad real \"\(Self.clip(s))\"", at: at)
        }
        return .real(d)
    }

    mutating func date(_ tag: Tag) throws(PropertyListError) -> PropertyListValue {
        let at = p
        let s = try text(tag)
        if let t = Self.parseDate(Array(s.utf8)) { return .date(t) }
        // Extension: dates beyond the calendar range are written as seconds.
        if let t = Self.parseReal(Substring(s)), !t.isFinite || t.magnitude >= PlistCalendar.calendarLimit {
            return .date(t)
        }
        throw error("bad date \"\(Self.clip(s))\" (expected YYYY-MM-DDTHH:MM:SSZ)", at: at)
    }

    /// YYYY-MM-DDTHH:MM:SS[.fraction]Z, proleptic Gregorian, year may be negative or longer.
    static func parseDate(_ c: [UInt8]) -> Double? {
        var i = 0
        func digits(_ min: Int, _ max: Int) -> Int64? {
            var v: Int64 = 0
            var n = 0
            while i < c.count, c[i] >= 0x30, c[i] <= 0x39, n < max {
                v = v * 10 + Int64(c[i] - 0x30)
                i += 1
                n += 1
            }
            if i < c.count, c[i] >= 0x30, c[i] <= 0x39 { return nil }
            return n >= min ? v : nil
        }
        func expect(_ ch: Character) -> Bool {
            guard i < c.count, c[i] == ch.asciiValue else { return false }
            i += 1
            return true
        }
        var negative = false
        if i < c.count, c[i] == UInt8(ascii: "-") {
            negative = true
            i += 1
        }
        guard let y0 = digits(negative ? 3 : 4, 11) else { return nil }
        let year = negative ? -y0 : y0
        guard expect("-"), let month = digits(2, 2), expect("-"), let day = digits(2, 2), expect("T"),
            let hour = digits(2, 2), expect(":"), let minute = digits(2, 2), expect(":"),
            let second = digits(2, 2)
        else { return nil }
        var fraction = ""
        if i < c.count, c[i] == UInt8(ascii: ".") {
            i += 1
            let s = i
            while i < c.count, c[i] >= 0x30, c[i] <= 0x39 { i += 1 }
            // The writer's shortest exact fraction of a Double has at most 17 significant digits
            // after up to 324 zeros (the smallest subnormal); longer is not a date we wrote.
            guard i > s, i - s <= 400 else { return nil }
            fraction = String(decoding: c[s..<i], as: UTF8.self)
        }
        guard expect("Z"), i == c.count else { return nil }
        guard (1...12).contains(month), day >= 1,
            day <= Int64(PlistCalendar.daysIn(month: Int(month), year: year)),
            hour <= 23, minute <= 59, second <= 59
        else { return nil }
        let days =
            PlistCalendar.days(year: year, month: Int(month), day: Int(day)) - PlistCalendar.referenceDay
        let (ds, o) = days.multipliedReportingOverflow(by: 86400)
        guard !o else { return nil }
        let (w, o2) = ds.addingReportingOverflow(hour * 3600 + minute * 60 + second)
        guard !o2 else { return nil }
        return PlistCalendar.seconds(whole: w, fraction: fraction)
    }

    mutating func data(_ tag: Tag) throws(PropertyListError) -> PropertyListValue {
        if tag.selfClosing { return .data(Data()) }
        let contentStart = p
        var sextets: [UInt8] = []
        var padding = 0
        while p < b.count && b[p] != UInt8(ascii: "<") {
            let c = b[p]
            if Self.isSpace(c) {
                p += 1
                continue
            }
            if c == UInt8(ascii: "=") {
                padding += 1
                if padding > 2 { throw error("too much '=' padding in <data>", at: p) }
                p += 1
                continue
            }
            guard let v = Self.base64Value(c) else {
                var e = p + 1
                while e < b.count && b[e] & 0xC0 == 0x80 { e += 1 }
                throw error(
                    "invalid character '\(String(decoding: b[p..<e], as: UTF8.self))' in <data>", at: p)
            }
            if padding > 0 { throw error("base64 character after '=' padding in <data>", at: p) }
            sextets.append(v)
            p += 1
        }
        guard p < b.count else { throw error("unexpected end of input, expected </data>", at: p) }
        guard has("</", at: p) else { throw error("expected </data>, found \(found(at: p))", at: p) }
        let endAt = p
        let n = try endTag()
        guard n == "data" else { throw error("expected </data>, found </\(n)>", at: endAt) }
        let total = sextets.count + padding
        guard total % 4 == 0, padding == 0 || sextets.count % 4 == 4 - padding else {
            throw error(
                "base64 in <data> has \(total) characters; expected a multiple of 4", at: contentStart)
        }
        var out = [UInt8]()
        out.reserveCapacity(sextets.count * 3 / 4)
        var i = 0
        while i + 4 <= sextets.count {
            let v =
                UInt32(sextets[i]) << 18 | UInt32(sextets[i + 1]) << 12 | UInt32(sextets[i + 2]) << 6
                | UInt32(sextets[i + 3])
            out.append(UInt8(truncatingIfNeeded: v >> 16))
            out.append(UInt8(truncatingIfNeeded: v >> 8))
            out.append(UInt8(truncatingIfNeeded: v))
            i += 4
        }
        let rest = sextets.count - i
        if rest == 2 {
            out.append(sextets[i] << 2 | sextets[i + 1] >> 4)
        } else if rest == 3 {
            out.append(sextets[i] << 2 | sextets[i + 1] >> 4)
            out.append((sextets[i + 1] & 0x0F) << 4 | sextets[i + 2] >> 2)
        }
        return .data(Data(out))
    }

    static func base64Value(_ c: UInt8) -> UInt8? {
        switch c {
        case 0x41...0x5A: return c - 0x41
        case 0x61...0x7A: return c - 0x61 + 26
        case 0x30...0x39: return c - 0x30 + 52
        case UInt8(ascii: "+"): return 62
        case UInt8(ascii: "/"): return 63
        default: return nil
        }
    }
}
