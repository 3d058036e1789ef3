// The property-list codec's entry points: decode and encode binary ("bplist00") and XML
// property lists, and describe a value as `plutil -p` does. Foundation is used only for `Data`,
// base64 encoding and `log10`; no PropertyListSerialization, no XMLParser.
//
// Readers are written for hostile input: every offset, count and size is
// bounds-checked with overflow-safe arithmetic, nesting and object counts are
// limited, and neither reader recurses (both use explicit stacks), so nesting
// depth cannot exhaust the call stack. Writers recurse once per nesting level
// of the value they are given.
//
// The codec, one file each: PropertyListValue (the value and its exact equality),
// PropertyListBinaryReader, PropertyListBinaryWriter, PropertyListXMLReader (markup and
// structure) with PropertyListXMLReader+Content (the text inside elements),
// PropertyListXMLWriter, PropertyListDescriber, and the helpers the XML side and the describer
// share: PropertyListCalendar (dates) and PropertyListRealFormat (CF's "%.17g").
//
// The codec's choices (integers past Int64, booleans' sharing, dates beyond the calendar) are
// explained in docs/library/property-lists.md.

import Foundation

// MARK: - Error

/// Why a property list could not be read.
public struct PropertyListError: Error, Sendable, Hashable, CustomStringConvertible {
    /// 1-based line of the problem (XML only).
    public var line: Int?
    /// 1-based column of the problem, counted in Unicode scalars from the start of the line
    /// (a leading byte-order mark is not counted; tabs count as one). XML only.
    public var column: Int?
    /// What was expected and what was found, e.g. "expected </integer>, found </integr>".
    public var reason: String

    public init(_ reason: String, line: Int? = nil, column: Int? = nil) {
        self.reason = reason
        self.line = line
        self.column = column
    }

    /// "line 5, column 3: <reason>" when the location is known, else just the reason.
    public var description: String {
        switch (line, column) {
        case (let l?, let c?): return "line \(l), column \(c): \(reason)"
        case (let l?, nil): return "line \(l): \(reason)"
        default: return reason
        }
    }
}

// MARK: - API

public enum PropertyList {
    /// Bounds for the readers. The defaults accept anything CF writes in practice.
    public struct Limits: Sendable, Hashable {
        /// Largest input, in bytes. For binary input it also bounds the total size of the
        /// strings and data of the decoded value, counting shared objects once per reference.
        public var maximumSize: Int
        /// Deepest nesting of arrays and dictionaries (a top-level container is depth 1).
        public var maximumDepth: Int
        /// Most objects: binary trailer object count, and the number of values and keys of
        /// the decoded value (shared binary objects count once per reference, so a small
        /// file whose references fan out cannot decode into a huge tree).
        public var maximumObjectCount: Int

        public init(maximumSize: Int = 64 << 20, maximumDepth: Int = 512, maximumObjectCount: Int = 1 << 22) {
            self.maximumSize = maximumSize
            self.maximumDepth = maximumDepth
            self.maximumObjectCount = maximumObjectCount
        }

        public static let standard = Limits()
    }

    /// How the binary writer shares equal leaf objects.
    public enum BinaryUniquing: Sendable, Hashable {
        /// Equal strings, integers, reals, dates, data and UIDs are written once and shared.
        /// Booleans are treated as CF treats them: every occurrence is written, and every
        /// reference points at the first copy (see `BinaryWriter.flatten`). The default.
        case byValue
        /// Reproduces what swift-corelibs-foundation writes for values it bridged from
        /// Swift, where sharing follows object identity: strings, data and dates are
        /// never shared; integers -1...12 and reals 0.0, 1.0, ±infinity and NaN are
        /// shared (CF caches those numbers); booleans and UIDs are written once per
        /// occurrence but every reference points at the first copy.
        case corelibs
    }

    static let binaryMagic: [UInt8] = Array("bplist00".utf8)

    /// Whether `data` starts with the binary magic "bplist00".
    public static func isBinary(_ data: Data) -> Bool {
        data.count >= 8 && data.prefix(8).elementsEqual(binaryMagic)
    }

    /// Whether `bytes` starts with the binary magic "bplist00".
    public static func isBinary<C: Collection>(_ bytes: C) -> Bool where C.Element == UInt8 {
        bytes.prefix(8).elementsEqual(binaryMagic)
    }

    /// Decodes binary or XML, chosen by the "bplist00" magic.
    public static func decode(_ data: Data, limits: Limits = .standard) throws(PropertyListError)
        -> PropertyListValue
    {
        isBinary(data) ? try decodeBinary(data, limits: limits) : try decodeXML(data, limits: limits)
    }

    public static func decodeBinary(_ data: Data, limits: Limits = .standard) throws(PropertyListError)
        -> PropertyListValue
    {
        guard data.count <= limits.maximumSize else {
            throw PropertyListError(
                "binary: input is \(data.count) bytes, more than the limit of \(limits.maximumSize)")
        }
        var reader = BinaryReader(bytes: [UInt8](data), limits: limits)
        return try reader.decode()
    }

    public static func encodeBinary(_ value: PropertyListValue, uniquing: BinaryUniquing = .byValue) -> Data {
        var writer = BinaryWriter(uniquing: uniquing)
        return writer.encode(value)
    }

    /// CF's XML layout, byte for byte, except that dictionary keys keep the value's order
    /// (CF sorts them; use `sortedKeys()` first to match) and dates with a fractional
    /// second keep it as `2001-01-01T00:00:01.25Z` (CF drops it, and CF's reader rejects
    /// that form). Pass `dropDateFractions: true` to write whole seconds (rounded down) as
    /// CF does, for files Apple's tools must read.
    public static func encodeXML(_ value: PropertyListValue, dropDateFractions: Bool = false) -> Data {
        var out: [UInt8] = []
        out.reserveCapacity(256)
        out.append(contentsOf: xmlHeader)
        XMLWriter(dropDateFractions: dropDateFractions).write(value, indent: 0, into: &out)
        out.append(contentsOf: Array("</plist>\n".utf8))
        return Data(out)
    }

    public static func decodeXML(_ data: Data, limits: Limits = .standard) throws(PropertyListError)
        -> PropertyListValue
    {
        guard data.count <= limits.maximumSize else {
            throw PropertyListError(
                "input is \(data.count) bytes, more than the limit of \(limits.maximumSize)")
        }
        var reader = XMLReader(bytes: [UInt8](data), limits: limits)
        return try reader.parseDocument()
    }

    /// Pretty text for humans, like `plutil -p`.
    public static func describe(_ value: PropertyListValue) -> String {
        var out = ""
        Describer.describe(value, level: 0, into: &out)
        return out
    }

    static let xmlHeader: [UInt8] = Array(
        """
        <?xml version="1.0" encoding="UTF-8"?>
        <!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
        <plist version="1.0">

        """.utf8)
}
