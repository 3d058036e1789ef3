import Foundation

// MARK: - XML reader

/// Reads an XML property list without XMLParser: a scanner for the XML that property lists use
/// (declaration, DOCTYPE, comments, processing instructions, CDATA, entities) that keeps byte
/// positions, so every error can say its line and column.
struct XMLReader {
    let b: [UInt8]
    let limits: PropertyList.Limits
    var p = 0
    var bom = 0
    var objects = 0

    init(bytes: [UInt8], limits: PropertyList.Limits) {
        b = bytes
        self.limits = limits
    }

    // MARK: errors and positions

    func location(_ pos: Int) -> (line: Int, column: Int) {
        let end = min(max(pos, 0), b.count)
        var line = 1
        var lineStart = min(bom, end)
        var i = lineStart
        while i < end {
            if b[i] == 0x0A {
                line += 1
                lineStart = i + 1
            }
            i += 1
        }
        var column = 1
        i = lineStart
        while i < end {
            if b[i] & 0xC0 != 0x80 { column += 1 }
            i += 1
        }
        return (line, column)
    }

    func error(_ reason: String, at pos: Int) -> PropertyListError {
        let (l, c) = location(pos)
        return PropertyListError(reason, line: l, column: c)
    }

    /// A short rendering of what is at `pos`, for "found ..." messages.
    func found(at pos: Int) -> String {
        guard pos < b.count else { return "end of input" }
        if b[pos] == UInt8(ascii: "<") {
            var e = pos
            while e < b.count && e - pos < 60 && b[e] != UInt8(ascii: ">") { e += 1 }
            let closed = e < b.count && b[e] == UInt8(ascii: ">")
            return String(decoding: b[pos..<(closed ? e + 1 : e)], as: UTF8.self) + (closed ? "" : "…")
        }
        var e = pos
        while e < b.count && e - pos < 24 && b[e] != UInt8(ascii: "<") && b[e] != 0x0A { e += 1 }
        return "text \"" + String(decoding: b[pos..<e], as: UTF8.self) + "\""
    }

    // MARK: low-level scanning

    @inline(__always) static func isSpace(_ c: UInt8) -> Bool {
        c == 0x20 || c == 0x09 || c == 0x0A || c == 0x0D
    }

    @inline(__always) static func isNameStart(_ c: UInt8) -> Bool {
        (c >= 0x61 && c <= 0x7A) || (c >= 0x41 && c <= 0x5A) || c == UInt8(ascii: "_")
            || c == UInt8(ascii: ":")
    }

    @inline(__always) static func isNameChar(_ c: UInt8) -> Bool {
        isNameStart(c) || (c >= 0x30 && c <= 0x39) || c == UInt8(ascii: "-") || c == UInt8(ascii: ".")
    }

    func has(_ s: StaticString, at pos: Int) -> Bool {
        let n = s.utf8CodeUnitCount
        guard pos + n <= b.count else { return false }
        return s.withUTF8Buffer { buf in
            var i = 0
            while i < n {
                if b[pos + i] != buf[i] { return false }
                i += 1
            }
            return true
        }
    }

    func find(_ s: StaticString, from pos: Int) -> Int? {
        var i = pos
        let first = s.withUTF8Buffer { $0[0] }
        while i < b.count {
            if b[i] == first && has(s, at: i) { return i }
            i += 1
        }
        return nil
    }

    mutating func skipSpace() {
        while p < b.count && Self.isSpace(b[p]) { p += 1 }
    }

    /// Skips whitespace, comments and (if allowed) processing instructions.
    mutating func skipMisc(processingInstructions: Bool) throws(PropertyListError) {
        while true {
            skipSpace()
            if has("<!--", at: p) {
                guard let end = find("-->", from: p + 4) else { throw error("unterminated comment", at: p) }
                p = end + 3
            } else if processingInstructions && has("<?", at: p) {
                guard let end = find("?>", from: p + 2) else {
                    throw error("unterminated processing instruction", at: p)
                }
                p = end + 2
            } else {
                return
            }
        }
    }

    /// Index of the first invalid UTF-8 byte in b[from..<to], if any.
    func invalidUTF8(_ from: Int, _ to: Int) -> Int? {
        var i = from
        while i < to {
            let c = b[i]
            if c < 0x80 {
                i += 1
                continue
            }
            let need: Int
            var lowest: UInt32
            var v: UInt32
            if c & 0xE0 == 0xC0 {
                need = 1
                lowest = 0x80
                v = UInt32(c & 0x1F)
            } else if c & 0xF0 == 0xE0 {
                need = 2
                lowest = 0x800
                v = UInt32(c & 0x0F)
            } else if c & 0xF8 == 0xF0 {
                need = 3
                lowest = 0x10000
                v = UInt32(c & 0x07)
            } else {
                return i
            }
            guard i + need < to else { return i }
            for k in 1...need {
                let cc = b[i + k]
                guard cc & 0xC0 == 0x80 else { return i }
                v = v << 6 | UInt32(cc & 0x3F)
            }
            if v < lowest || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF) { return i }
            i += need + 1
        }
        return nil
    }

    func name(at pos: Int) -> (String, Int)? {
        guard pos < b.count, Self.isNameStart(b[pos]) else { return nil }
        var e = pos + 1
        while e < b.count && Self.isNameChar(b[e]) { e += 1 }
        return (String(decoding: b[pos..<e], as: UTF8.self), e)
    }

    struct Tag {
        var name: String
        var selfClosing: Bool
        var start: Int
    }

    /// Parses `<name attr="v" ...>` or `.../>` at p (b[p] == '<'). Attributes are checked for
    /// well-formedness and ignored.
    mutating func startTag() throws(PropertyListError) -> Tag {
        let start = p
        guard let (n, e) = name(at: p + 1) else {
            throw error("expected an element name after '<', found \(found(at: p))", at: p)
        }
        p = e
        while true {
            let before = p
            skipSpace()
            guard p < b.count else { throw error("unterminated tag <\(n)", at: start) }
            if b[p] == UInt8(ascii: ">") {
                p += 1
                return Tag(name: n, selfClosing: false, start: start)
            }
            if has("/>", at: p) {
                p += 2
                return Tag(name: n, selfClosing: true, start: start)
            }
            guard p > before, let (_, ae) = name(at: p) else {
                throw error("malformed tag <\(n)>: unexpected \(found(at: p))", at: p)
            }
            p = ae
            skipSpace()
            guard p < b.count, b[p] == UInt8(ascii: "=") else {
                throw error("malformed attribute in <\(n)>: expected '='", at: p)
            }
            p += 1
            skipSpace()
            guard p < b.count, b[p] == UInt8(ascii: "\"") || b[p] == UInt8(ascii: "'") else {
                throw error("malformed attribute in <\(n)>: expected a quoted value", at: p)
            }
            let quote = b[p]
            var q = p + 1
            while q < b.count && b[q] != quote && b[q] != UInt8(ascii: "<") { q += 1 }
            guard q < b.count, b[q] == quote else {
                throw error("unterminated attribute value in <\(n)>", at: p)
            }
            if let bad = invalidUTF8(p + 1, q) { throw error("invalid UTF-8", at: bad) }
            p = q + 1
        }
    }

    /// Parses `</name>` at p (b[p...] == "</").
    mutating func endTag() throws(PropertyListError) -> String {
        let start = p
        guard let (n, e) = name(at: p + 2) else {
            throw error("malformed end tag \(found(at: start))", at: start)
        }
        p = e
        skipSpace()
        guard p < b.count, b[p] == UInt8(ascii: ">") else {
            throw error("malformed end tag </\(n)", at: start)
        }
        p += 1
        return n
    }

    // MARK: document

    mutating func parseDocument() throws(PropertyListError) -> PropertyListValue {
        if b.count >= 2 && ((b[0] == 0xFE && b[1] == 0xFF) || (b[0] == 0xFF && b[1] == 0xFE)) {
            throw PropertyListError("UTF-16 input is not supported; only UTF-8", line: 1, column: 1)
        }
        if b.count >= 3 && b[0] == 0xEF && b[1] == 0xBB && b[2] == 0xBF {
            bom = 3
            p = 3
        }
        if has("<?xml", at: p), p + 5 < b.count, Self.isSpace(b[p + 5]) || b[p + 5] == UInt8(ascii: "?") {
            try xmlDeclaration()
        }
        try skipMisc(processingInstructions: true)
        if has("<!DOCTYPE", at: p) {
            try doctype()
            try skipMisc(processingInstructions: true)
        }
        guard p < b.count, b[p] == UInt8(ascii: "<"), !has("</", at: p), !has("<!", at: p) else {
            throw error("expected <plist> or a value, found \(found(at: p))", at: p)
        }
        let root = try startTag()
        let value: PropertyListValue
        if root.name == "plist" {
            if root.selfClosing { throw error("empty <plist>", at: root.start) }
            try skipMisc(processingInstructions: false)
            if has("</", at: p) {
                let at = p
                let n = try endTag()
                throw error(n == "plist" ? "empty <plist>" : "expected a value, found </\(n)>", at: at)
            }
            guard p < b.count, b[p] == UInt8(ascii: "<"), !has("<!", at: p) else {
                throw error("expected a value inside <plist>, found \(found(at: p))", at: p)
            }
            let first = try startTag()
            value = try parseValue(first)
            try skipMisc(processingInstructions: false)
            guard has("</", at: p) else {
                throw error(
                    "expected </plist>, found \(found(at: p))"
                        + (p < b.count ? " (a plist holds one value)" : ""), at: p)
            }
            let at = p
            let n = try endTag()
            guard n == "plist" else { throw error("expected </plist>, found </\(n)>", at: at) }
        } else {
            value = try parseValue(root)
        }
        try skipMisc(processingInstructions: true)
        if p < b.count {
            throw error("unexpected \(found(at: p)) after the end of the property list", at: p)
        }
        return value
    }

    mutating func xmlDeclaration() throws(PropertyListError) {
        let start = p
        guard let end = find("?>", from: p + 5) else {
            throw error("unterminated <?xml declaration", at: start)
        }
        // Look for encoding="..."
        var i = p + 5
        while i < end {
            if has("encoding", at: i) {
                var q = i + 8
                while q < end && Self.isSpace(b[q]) { q += 1 }
                if q < end && b[q] == UInt8(ascii: "=") {
                    q += 1
                    while q < end && Self.isSpace(b[q]) { q += 1 }
                    if q < end && (b[q] == UInt8(ascii: "\"") || b[q] == UInt8(ascii: "'")) {
                        let quote = b[q]
                        var r = q + 1
                        while r < end && b[r] != quote { r += 1 }
                        let enc = String(decoding: b[(q + 1)..<r], as: UTF8.self).lowercased()
                        if !["utf-8", "utf8", "us-ascii", "ascii"].contains(enc) {
                            throw error("unsupported encoding \"\(enc)\" (only UTF-8 is read)", at: q + 1)
                        }
                    }
                }
                break
            }
            i += 1
        }
        p = end + 2
    }

    mutating func doctype() throws(PropertyListError) {
        let start = p
        var i = p + 9
        var bracket = 0
        var quote: UInt8 = 0
        while i < b.count {
            let c = b[i]
            if quote != 0 {
                if c == quote { quote = 0 }
            } else if c == UInt8(ascii: "\"") || c == UInt8(ascii: "'") {
                quote = c
            } else if c == UInt8(ascii: "[") {
                bracket += 1
            } else if c == UInt8(ascii: "]") {
                bracket -= 1
            } else if c == UInt8(ascii: ">") && bracket <= 0 {
                p = i + 1
                return
            }
            i += 1
        }
        throw error("unterminated <!DOCTYPE", at: start)
    }

    // MARK: values

    enum Kind { case array, dictionary }

    struct Frame {
        var kind: Kind
        var start: Int
        var items: [PropertyListValue] = []
        var entries: [PropertyListValue.Entry] = []
        var pendingKey: String? = nil
        var seen: [ExactString: Int] = [:]
        var keyStarts: [Int] = []
        var name: String { kind == .array ? "array" : "dict" }
    }

    mutating func count(at pos: Int) throws(PropertyListError) {
        objects += 1
        if objects > limits.maximumObjectCount {
            throw error("more than \(limits.maximumObjectCount) objects", at: pos)
        }
    }

    static func finish(_ frame: Frame) -> PropertyListValue {
        if frame.kind == .array { return .array(frame.items) }
        if frame.entries.count == 1, frame.entries[0].key == "CF$UID",
            case .integer(let n) = frame.entries[0].value, n >= 0, n <= Int128(UInt64.max)
        {
            return .uid(UInt64(n))
        }
        return .dictionary(frame.entries)
    }

    /// Parses one value whose start tag has been read, iteratively.
    mutating func parseValue(_ first: Tag) throws(PropertyListError) -> PropertyListValue {
        var stack: [Frame] = []
        var pending: Tag? = first
        while true {
            let tag: Tag
            if let t = pending {
                tag = t
                pending = nil
            } else {
                // Inside a container: skip whitespace and comments, then a tag must follow.
                try skipMisc(processingInstructions: false)
                guard let top = stack.last else { throw error("internal error", at: p) }
                guard p < b.count else {
                    if let k = top.pendingKey {
                        throw error("unexpected end of input, expected a value for key \"\(k)\"", at: p)
                    }
                    throw error("unexpected end of input, expected </\(top.name)>", at: p)
                }
                guard b[p] == UInt8(ascii: "<") else {
                    throw error("unexpected \(found(at: p)) inside <\(top.name)>", at: p)
                }
                if has("</", at: p) {
                    let at = p
                    let n = try endTag()
                    if let k = top.pendingKey {
                        throw error("expected a value for key \"\(k)\", found </\(n)>", at: at)
                    }
                    guard n == top.name else { throw error("expected </\(top.name)>, found </\(n)>", at: at) }
                    let frame = stack.removeLast()
                    let v = Self.finish(frame)
                    if stack.isEmpty { return v }
                    Self.add(v, to: &stack[stack.count - 1])
                    continue
                }
                if has("<!", at: p) || has("<?", at: p) {
                    throw error("unexpected \(found(at: p)) inside <\(top.name)>", at: p)
                }
                tag = try startTag()
            }

            try count(at: tag.start)
            if tag.name == "key" {
                guard let top = stack.last, top.kind == .dictionary else {
                    throw error("unexpected <key> outside a <dict>", at: tag.start)
                }
                if let k = top.pendingKey {
                    throw error("expected a value for key \"\(k)\", found <key>", at: tag.start)
                }
                let key = try text(tag)
                let fi = stack.count - 1
                var previous: Int? = nil
                if stack[fi].entries.count < 16 {
                    if let i = stack[fi].entries.firstIndex(where: { exactEqual($0.key, key) }) {
                        previous = stack[fi].keyStarts[i]
                    }
                } else {
                    if stack[fi].seen.isEmpty {
                        for (i, e) in stack[fi].entries.enumerated() {
                            stack[fi].seen[ExactString(e.key)] = stack[fi].keyStarts[i]
                        }
                    }
                    previous = stack[fi].seen.updateValue(tag.start, forKey: ExactString(key))
                }
                if let previous {
                    let (l, c) = location(previous)
                    throw error("duplicate key \"\(key)\" (first at line \(l), column \(c))", at: tag.start)
                }
                stack[fi].keyStarts.append(tag.start)
                stack[fi].pendingKey = key
                continue
            }
            if let top = stack.last, top.kind == .dictionary, top.pendingKey == nil {
                throw error("expected <key> or </dict>, found <\(tag.name)>", at: tag.start)
            }
            let value: PropertyListValue
            switch tag.name {
            case "array", "dict":
                let kind: Kind = tag.name == "array" ? .array : .dictionary
                if tag.selfClosing {
                    value = kind == .array ? .array([]) : .dictionary([])
                } else {
                    guard stack.count < limits.maximumDepth else {
                        throw error("nesting deeper than the limit of \(limits.maximumDepth)", at: tag.start)
                    }
                    stack.append(Frame(kind: kind, start: tag.start))
                    continue
                }
            case "string":
                value = .string(try text(tag))
            case "integer":
                value = try integer(tag)
            case "real":
                value = try real(tag)
            case "date":
                value = try date(tag)
            case "data":
                value = try data(tag)
            case "true", "false":
                if !tag.selfClosing {
                    let at = p
                    guard has("</", at: p) else {
                        throw error("expected </\(tag.name)>, found \(found(at: p))", at: p)
                    }
                    let n = try endTag()
                    guard n == tag.name else { throw error("expected </\(tag.name)>, found </\(n)>", at: at) }
                }
                value = .bool(tag.name == "true")
            case "plist":
                throw error("unexpected <plist> inside a property list", at: tag.start)
            default:
                throw error("unknown element <\(tag.name)>", at: tag.start)
            }
            if stack.isEmpty { return value }
            Self.add(value, to: &stack[stack.count - 1])
        }
    }

    static func add(_ v: PropertyListValue, to frame: inout Frame) {
        if frame.kind == .array {
            frame.items.append(v)
        } else if let k = frame.pendingKey {
            frame.entries.append(.init(key: k, value: v))
            frame.pendingKey = nil
        }
    }
}
