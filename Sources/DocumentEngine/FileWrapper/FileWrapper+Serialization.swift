import Foundation

extension FileWrapper {
    /// The version of the serialized-representation format this program writes and reads.
    ///
    /// ## Serialized representation, format version 1
    ///
    /// A whole wrapper tree in one byte string (SR-1). This is DocFS's own format: Apple's byte
    /// layout is undocumented and is neither read nor written. Integers are little-endian, unsigned
    /// unless marked i64; every variable-length field has an explicit length before it.
    ///
    ///     Document
    ///       magic       8 bytes    "DOCFSFW" and a NUL byte: 44 4F 43 46 53 46 57 00
    ///       version     u16        1
    ///       root        Node
    ///       checksum    u32        CRC-32 (IEEE 802.3: reflected polynomial 0xEDB88320, initial
    ///                              value and final XOR 0xFFFFFFFF) of all bytes before it
    ///
    ///     Node
    ///       kind        u8         1 regular file, 2 directory, 3 symbolic link, 4 special file
    ///       flags       u8         bit 0: a preferred name follows; bit 1: a modification
    ///                              date follows; the other bits are 0
    ///       permissions u16        POSIX permission bits, at most 0o7777
    ///       [bit 0]     Name       the preferred name (SR-3)
    ///       [bit 1]     i64, u32   modification date: seconds since 1970-01-01 00:00 UTC
    ///                              (negative before; at most 2^53 either way), then
    ///                              nanoseconds, below 1_000_000_000
    ///       xattrCount  u32        then that many extended attributes, sorted by name bytes:
    ///                                name   Name: "user." and at least one more byte
    ///                                value  u32 length, then the bytes
    ///       contents               by kind:
    ///         regular file         u64 length, then the file's bytes
    ///         directory            u32 child count, then per child, sorted by key bytes:
    ///                                key    Name: the key in this directory, not re-uniqued
    ///                                child  Node
    ///         symbolic link        u32 length, then the destination path: UTF-8 without NUL
    ///         special file         u8 kind (1 fifo, 2 socket, 3 character device, 4 block
    ///                              device), then u64 device number (0 for a fifo or socket)
    ///
    ///     Name                     u16 length (1...255), then that many bytes of UTF-8
    ///
    /// Keys and preferred names are valid file names: not empty, "." or "..", without "/" or NUL
    /// (``FileName/problem(with:)``). Extended-attribute names may hold "/" but not NUL. A child
    /// without a preferred name takes the one derived from its key
    /// (``preferredFilename(fromKey:)``, SR-3); the root's stays nil. Directories nest at most
    /// ``maximumSerializationDepth`` levels below the root.
    ///
    /// A `Date` decodes to exactly the `Date` that was encoded. `Date` is a Double of seconds since
    /// 2001, so for today's dates it resolves about 0.1 µs: finer nanoseconds in a hand-made
    /// encoding are rounded to the nearest `Date`.
    ///
    /// The encoding is deterministic: the same tree gives the same bytes. Not encoded: owner,
    /// group, creation date and `filename`. A wrapper that is a child of several directories in
    /// the tree is encoded, and decoded, once per parent.
    ///
    /// The decoder accepts exactly this grammar. Every length is checked against the bytes left
    /// before anything is allocated; a wrong magic or checksum, unknown kinds or flags, lengths
    /// past the end, trailing bytes, invalid UTF-8, hostile or duplicate names (duplicates by
    /// Swift `String` equality, as keys compare), or permissions over 0o7777 throw
    /// ``FileWrapperError/corruptSerializedRepresentation(reason:offset:)`` with the offset of
    /// the field at fault. Another version throws
    /// ``FileWrapperError/unsupportedSerializationVersion(_:)``.
    public static let serializationVersion: UInt16 = 1

    /// How many directory levels below the root a serialized tree may nest. The decoder recurses
    /// once per level, so this bounds its stack use on hostile input.
    public static let maximumSerializationDepth = 256

    /// The whole tree encoded as one byte string in DocFS's documented format (see
    /// ``serializationVersion``), or nil if it cannot be encoded — typically because a
    /// lazily read part can no longer be loaded (SR-2). ``serialized()`` says why.
    public var serializedRepresentation: Data? {
        try? serialized()
    }

    /// The whole tree encoded as one byte string, with preferred names (SR-1, SR-3).
    ///
    /// Lazily read parts are loaded as needed; file contents are copied by range without being
    /// kept in the wrappers. Throws the load error of a lazy part,
    /// ``FileWrapperError/invalidFilename(_:reason:)`` for a key or preferred name that is not a
    /// valid file name, and ``FileWrapperError/cannotSerialize(reason:)`` for a tree the format
    /// cannot hold (deeper than ``maximumSerializationDepth``, a link destination with NUL, a
    /// date out of range), so that whatever this returns decodes.
    public func serialized() throws -> Data {
        var encoder = SerializationEncoder()
        encoder.output.append(contentsOf: SerializationFormat.magic)
        encoder.append(FileWrapper.serializationVersion)
        try encoder.encode(self, depth: 0)
        encoder.append(SerializationFormat.crc32(encoder.output))
        return encoder.output
    }

    /// Decodes a tree written by ``serialized()``, or returns nil if `serializedRepresentation`
    /// is not a valid encoding (SR-1, SR-3). ``init(validatingSerializedRepresentation:)`` says
    /// what is wrong.
    public convenience init?(serializedRepresentation: Data) {
        do {
            try self.init(validatingSerializedRepresentation: serializedRepresentation)
        } catch {
            return nil
        }
    }

    /// Decodes a tree written by ``serialized()``. Children keep their encoded keys and preferred
    /// names (SR-3); the wrappers hold their contents in memory and have no `filename`.
    ///
    /// Throws ``FileWrapperError/unsupportedSerializationVersion(_:)`` for another format version
    /// and ``FileWrapperError/corruptSerializedRepresentation(reason:offset:)`` for anything
    /// malformed, never trusting a length before checking it against the data.
    public convenience init(validatingSerializedRepresentation data: Data) throws {
        var decoder = try SerializationDecoder(data)
        let root = try decoder.decodeNode(depth: 0)
        try decoder.finish()
        self.init(storage: root.storage, attributes: root.attributes)
        state.withLock { $0.preferredFilename = root.preferredFilename }
        adoptDecodedChildren()
    }

    /// Makes this wrapper the parent of its decoded children, so that a later change of a
    /// child's preferred name re-keys it here (FW-11), as ``addFileWrapper(_:)`` would have.
    fileprivate func adoptDecodedChildren() {
        let children = state.withLock { s -> [FileWrapper] in
            guard case .directory(let d) = s.storage else { return [] }
            return Array((d.children ?? [:]).values)
        }
        for child in children {
            child.state.withLock { $0.parents[ObjectIdentifier(self)] = WeakParent(wrapper: self) }
        }
    }
}

private enum SerializationFormat {
    static let magic: [UInt8] = Array("DOCFSFW".utf8) + [0]
    static let headerSize = 10
    static let checksumSize = 4
    /// kind, flags, permissions, xattr count and the smallest contents (a child count or a link
    /// length of 4 bytes).
    static let minimumNodeSize = 12
    /// A one-byte key and the smallest node.
    static let minimumChildSize = 3 + minimumNodeSize
    /// A six-byte name ("user." and one more) and an empty value.
    static let minimumXattrSize = 8 + 4
    static let minimumDocumentSize = headerSize + minimumNodeSize + checksumSize

    static let regularFile: UInt8 = 1
    static let directory: UInt8 = 2
    static let symbolicLink: UInt8 = 3
    /// A special file: a kind byte (below) and an 8-byte device number follow the attributes.
    static let specialFile: UInt8 = 4
    static let specialKinds: [UInt8: FileWrapper.Kind] = [
        1: .fifo, 2: .socket, 3: .characterDevice, 4: .blockDevice,
    ]

    static let hasPreferredName: UInt8 = 1 << 0
    static let hasModificationDate: UInt8 = 1 << 1
    static let knownFlags = hasPreferredName | hasModificationDate

    static let xattrPrefix = "user."
    /// Linux's XATTR_NAME_MAX.
    static let maximumXattrNameLength = 255
    /// Seconds from 1970-01-01 to `Date`'s reference date, 2001-01-01.
    static let unixToReferenceDate: Int64 = 978_307_200
    /// Whole seconds are exact in a Double up to here, and every decoded date must encode again.
    static let maximumDateSeconds: UInt64 = 1 << 53
    static let copyChunk = 1 << 20

    static let crcTable: [UInt32] = (0..<256).map { n in
        var c = UInt32(n)
        for _ in 0..<8 { c = c & 1 != 0 ? 0xEDB8_8320 ^ (c >> 1) : c >> 1 }
        return c
    }

    /// `date` as whole seconds since 1970 and nanoseconds, or nil beyond ±2^53 seconds.
    ///
    /// Split from the reference date, which is what `Date` stores, so that taking off the whole
    /// seconds is exact and decoding gives back this very `Date`.
    static func unixTime(of date: Date) -> (seconds: Int64, nanoseconds: UInt32)? {
        let interval = date.timeIntervalSinceReferenceDate
        let whole = interval.rounded(.down)
        guard var seconds = Int64(exactly: whole) else { return nil }
        var nanoseconds = ((interval - whole) * 1e9).rounded()
        if nanoseconds >= 1e9 {
            nanoseconds -= 1e9
            seconds += 1
        }
        let (unix, overflow) = seconds.addingReportingOverflow(unixToReferenceDate)
        guard !overflow, unix.magnitude <= maximumDateSeconds else { return nil }
        return (unix, UInt32(nanoseconds))
    }

    static func crc32(_ data: Data) -> UInt32 {
        var crc: UInt32 = 0xFFFF_FFFF
        data.withUnsafeBytes { bytes in
            crcTable.withUnsafeBufferPointer { table in
                for byte in bytes { crc = table[Int((crc ^ UInt32(byte)) & 0xFF)] ^ (crc >> 8) }
            }
        }
        return ~crc
    }

    /// Names sort by their UTF-8 bytes, which no locale or normalization can change.
    static func byBytes(_ a: String, _ b: String) -> Bool {
        a.utf8.lexicographicallyPrecedes(b.utf8)
    }

    /// Why `name` cannot be a `user.` extended-attribute name, or nil if it can.
    static func xattrNameProblem(_ name: String) -> String? {
        let length = name.utf8.count
        if !name.hasPrefix(xattrPrefix) { return "it is not in the user. namespace" }
        if length == xattrPrefix.utf8.count { return "it has nothing after user." }
        if name.utf8.contains(0) { return "it contains a NUL byte" }
        if length > maximumXattrNameLength { return "it is longer than \(maximumXattrNameLength) bytes" }
        return nil
    }
}

// MARK: - Encoding

private struct SerializationEncoder {
    var output = Data()

    mutating func append<T: FixedWidthInteger>(_ value: T) {
        withUnsafeBytes(of: value.littleEndian) { output.append(contentsOf: $0) }
    }

    /// The format cannot hold this tree; offset is how far the encoding got.
    func unencodable(_ reason: String) -> FileWrapperError {
        .cannotSerialize(reason: reason)
    }

    mutating func appendName(_ name: String) throws {
        try FileName.validate(name)
        append(UInt16(name.utf8.count))
        output.append(contentsOf: name.utf8)
    }

    mutating func encode(_ wrapper: FileWrapper, depth: Int) throws {
        guard depth <= FileWrapper.maximumSerializationDepth else {
            throw unencodable(
                "the tree is deeper than \(FileWrapper.maximumSerializationDepth) levels or contains itself")
        }
        // One snapshot per node, so its kind, attributes and contents belong together.
        let (storage, attributes, preferredName) = wrapper.state.withLock {
            ($0.storage, $0.attributes, $0.preferredFilename)
        }
        let kind: UInt8
        switch storage {
        case .regular: kind = SerializationFormat.regularFile
        case .directory: kind = SerializationFormat.directory
        case .link: kind = SerializationFormat.symbolicLink
        case .special: kind = SerializationFormat.specialFile
        }
        var flags: UInt8 = 0
        if preferredName != nil { flags |= SerializationFormat.hasPreferredName }
        if attributes.modificationDate != nil { flags |= SerializationFormat.hasModificationDate }
        append(kind)
        append(flags)
        append(UInt16(attributes.permissions & 0o7777))
        if let preferredName { try appendName(preferredName) }
        if let date = attributes.modificationDate { try appendDate(date) }
        try appendXattrs(attributes.extendedAttributes)

        switch storage {
        case .regular(let regular):
            try appendContents(regular, of: wrapper)
        case .directory:
            let children = try wrapper.children()
            guard let count = UInt32(exactly: children.count) else { throw unencodable("too many children") }
            append(count)
            for (key, child) in children.sorted(by: { SerializationFormat.byBytes($0.key, $1.key) }) {
                try appendName(key)
                try encode(child, depth: depth + 1)
            }
        case .link:
            let destination = try wrapper.symbolicLinkDestination()
            guard !destination.utf8.contains(0) else {
                throw unencodable("link destination \(destination.debugDescription) contains a NUL byte")
            }
            guard let length = UInt32(exactly: destination.utf8.count) else {
                throw unencodable("link destination too long")
            }
            append(length)
            output.append(contentsOf: destination.utf8)
        case .special(let specialKind, let device):
            guard let code = SerializationFormat.specialKinds.first(where: { $0.value == specialKind })?.key
            else { throw unencodable("unknown special file kind") }
            append(code)
            append(device)
        }
    }

    mutating func appendDate(_ date: Date) throws {
        guard let (seconds, nanoseconds) = SerializationFormat.unixTime(of: date) else {
            throw unencodable("modification date \(date.timeIntervalSince1970) is out of range")
        }
        append(seconds)
        append(nanoseconds)
    }

    mutating func appendXattrs(_ xattrs: [String: Data]) throws {
        guard let count = UInt32(exactly: xattrs.count) else {
            throw unencodable("too many extended attributes")
        }
        append(count)
        for (name, value) in xattrs.sorted(by: { SerializationFormat.byBytes($0.key, $1.key) }) {
            if let problem = SerializationFormat.xattrNameProblem(name) {
                throw unencodable("extended attribute name \(name.debugDescription): \(problem)")
            }
            guard let length = UInt32(exactly: value.count) else {
                throw unencodable("extended attribute \(name) is too long")
            }
            append(UInt16(name.utf8.count))
            output.append(contentsOf: name.utf8)
            append(length)
            output.append(value)
        }
    }

    /// Copies the contents by range, so a large lazily read file is never held whole in the
    /// wrapper; the length is written afterwards from what was actually read.
    mutating func appendContents(_ regular: FileWrapper.Regular, of wrapper: FileWrapper) throws {
        let lengthOffset = output.count
        append(UInt64(0))
        var copied: Int64 = 0
        if let loaded = regular.loaded {
            output.append(loaded)
            copied = Int64(loaded.count)
        } else {
            let source = regular.source
            do {
                while copied < source.count {
                    let count = Int(min(Int64(SerializationFormat.copyChunk), source.count - copied))
                    let chunk = try source.read(offset: copied, count: count)
                    if chunk.isEmpty { break }
                    output.append(chunk)
                    copied += Int64(chunk.count)
                }
            } catch {
                throw wrapper.noteLoadFailure(error)  // kept for the next write, like any lazy load
            }
        }
        withUnsafeBytes(of: UInt64(copied).littleEndian) { bytes in
            output.replaceSubrange(lengthOffset..<lengthOffset + 8, with: bytes)
        }
    }
}

// MARK: - Decoding

/// A decoded node not yet made into a wrapper, so that the root can become `self`.
private struct DecodedNode {
    var storage: FileWrapper.Storage
    var attributes: FileWrapper.Attributes
    var preferredFilename: String?
}

private struct SerializationDecoder {
    let data: Data
    /// Where the node data ends: the start of the checksum.
    let end: Int
    /// The offset of the next byte to read, from the start of `data`.
    var position: Int

    init(_ data: Data) throws {
        self.data = data
        let magic = SerializationFormat.magic
        for i in 0..<min(data.count, magic.count) where data[data.startIndex + i] != magic[i] {
            throw FileWrapperError.corruptSerializedRepresentation(
                reason: "wrong magic: not a serialized file wrapper", offset: i)
        }
        guard data.count >= SerializationFormat.headerSize else {
            throw FileWrapperError.corruptSerializedRepresentation(
                reason: "truncated: \(data.count) bytes is shorter than the header", offset: data.count)
        }
        let version = UInt16(data[data.startIndex + 8]) | UInt16(data[data.startIndex + 9]) << 8
        // Checked before the checksum: another version may place or compute it differently.
        guard version == FileWrapper.serializationVersion else {
            throw FileWrapperError.unsupportedSerializationVersion(version)
        }
        guard data.count >= SerializationFormat.minimumDocumentSize else {
            throw FileWrapperError.corruptSerializedRepresentation(
                reason:
                    "truncated: \(data.count) bytes is shorter than the smallest encoding "
                    + "(\(SerializationFormat.minimumDocumentSize))",
                offset: data.count)
        }
        end = data.count - SerializationFormat.checksumSize
        var stored: UInt32 = 0
        for i in 0..<4 { stored |= UInt32(data[data.startIndex + end + i]) << (8 * i) }
        let computed = SerializationFormat.crc32(data[data.startIndex..<data.startIndex + end])
        guard stored == computed else {
            throw FileWrapperError.corruptSerializedRepresentation(
                reason:
                    "checksum mismatch (stored \(hex(stored)), computed \(hex(computed))): "
                    + "the data is truncated or damaged",
                offset: end)
        }
        position = SerializationFormat.headerSize
    }

    func corrupt(_ reason: String, at offset: Int) -> FileWrapperError {
        .corruptSerializedRepresentation(reason: reason, offset: offset)
    }

    var remaining: Int { end - position }

    /// Throws unless `count` more bytes of `what` are there; called before every read and
    /// allocation, so no declared length is trusted.
    func require(_ count: UInt64, _ what: String) throws {
        guard count <= UInt64(remaining) else {
            throw corrupt(
                "\(what) of \(count) bytes runs past the end of the data (\(remaining) left)", at: position)
        }
    }

    mutating func integer<T: FixedWidthInteger & UnsignedInteger>(_: T.Type, _ what: String) throws -> T {
        let size = MemoryLayout<T>.size
        try require(UInt64(size), what)
        var value: T = 0
        let start = data.startIndex + position
        for i in 0..<size { value |= T(data[start + i]) << (8 * i) }
        position += size
        return value
    }

    /// The next `count` bytes, already checked to be there, as a view into `data`.
    mutating func bytes(_ count: Int) -> Data.SubSequence {
        let start = data.startIndex + position
        position += count
        return data[start..<start + count]
    }

    /// A u16-length UTF-8 string of at most `maximum` bytes; `offset` is where its length is.
    mutating func string(_ what: String, maximum: Int) throws -> (String, offset: Int) {
        let offset = position
        let length = try integer(UInt16.self, "\(what) length")
        guard length > 0 else { throw corrupt("\(what) is empty", at: offset) }
        guard Int(length) <= maximum else {
            throw corrupt("\(what) of \(length) bytes is longer than \(maximum) bytes", at: offset)
        }
        try require(UInt64(length), what)
        let raw = bytes(Int(length))
        guard let string = String(validating: raw, as: UTF8.self) else {
            throw corrupt(
                "\(what) \(FileName.escaped(Array(raw)).debugDescription) is not valid UTF-8", at: offset)
        }
        return (string, offset)
    }

    /// A key or preferred name: also a valid file name, so a decoded tree can be written safely.
    mutating func name(_ what: String) throws -> String {
        let (name, offset) = try string(what, maximum: FileName.maximumLength)
        if let problem = FileName.problem(with: name) {
            throw corrupt("\(what) \(name.debugDescription): \(problem)", at: offset)
        }
        return name
    }

    mutating func decodeNode(depth: Int) throws -> DecodedNode {
        let nodeOffset = position
        let kind = try integer(UInt8.self, "node kind")
        guard
            [
                SerializationFormat.regularFile, SerializationFormat.directory,
                SerializationFormat.symbolicLink, SerializationFormat.specialFile,
            ]
            .contains(kind)
        else {
            throw corrupt("unknown node kind \(kind)", at: nodeOffset)
        }
        let flags = try integer(UInt8.self, "node flags")
        guard flags & ~SerializationFormat.knownFlags == 0 else {
            throw corrupt("unknown node flags \(hex(flags))", at: position - 1)
        }
        let permissionsOffset = position
        let permissions = try integer(UInt16.self, "permissions")
        guard permissions <= 0o7777 else {
            throw corrupt(
                "permissions 0o\(String(permissions, radix: 8)) exceed 0o7777", at: permissionsOffset)
        }
        var attributes = FileWrapper.Attributes(permissions: Int(permissions))
        var preferredName: String?
        if flags & SerializationFormat.hasPreferredName != 0 {
            preferredName = try name("preferred name")
        }
        if flags & SerializationFormat.hasModificationDate != 0 {
            attributes.modificationDate = try date()
        }
        attributes.extendedAttributes = try xattrs()

        let storage: FileWrapper.Storage
        switch kind {
        case SerializationFormat.regularFile:
            let length = try integer(UInt64.self, "file length")
            try require(length, "file contents")
            let contents = Data(bytes(Int(length)))  // a copy, so its indices start at 0
            storage = .regular(FileWrapper.Regular(source: DataContentsSource(contents), loaded: contents))
        case SerializationFormat.directory:
            storage = .directory(FileWrapper.Directory(children: try children(depth: depth), origin: nil))
        case SerializationFormat.specialFile:
            let offset = position
            guard
                let specialKind = SerializationFormat.specialKinds[
                    try integer(UInt8.self, "special file kind")]
            else { throw corrupt("unknown special file kind", at: offset) }
            let device = try integer(UInt64.self, "device number")
            let isDevice = specialKind == .characterDevice || specialKind == .blockDevice
            guard isDevice || device == 0 else {
                throw corrupt("a device number on a fifo or socket", at: offset)
            }
            storage = .special(specialKind, device: device)
        default:
            let offset = position
            let length = try integer(UInt32.self, "link destination length")
            try require(UInt64(length), "link destination")
            let raw = bytes(Int(length))
            guard let destination = String(validating: raw, as: UTF8.self) else {
                throw corrupt("link destination is not valid UTF-8", at: offset)
            }
            guard !raw.contains(0) else { throw corrupt("link destination contains a NUL byte", at: offset) }
            storage = .link(FileWrapper.Link(destination: destination, origin: nil))
        }
        return DecodedNode(storage: storage, attributes: attributes, preferredFilename: preferredName)
    }

    mutating func date() throws -> Date {
        let offset = position
        let unix = Int64(bitPattern: try integer(UInt64.self, "modification date seconds"))
        let nanoseconds = try integer(UInt32.self, "modification date nanoseconds")
        guard nanoseconds < 1_000_000_000 else {
            throw corrupt("modification date nanoseconds \(nanoseconds) are not below 1e9", at: offset + 8)
        }
        guard unix.magnitude <= SerializationFormat.maximumDateSeconds else {
            throw corrupt("modification date seconds \(unix) are beyond ±2^53", at: offset)
        }
        // Exact for |unix| ≤ 2^53, and from the reference date like `unixTime(of:)`.
        let seconds = Double(unix) - Double(SerializationFormat.unixToReferenceDate)
        let date = Date(timeIntervalSinceReferenceDate: seconds + Double(nanoseconds) / 1e9)
        // Rounding to a `Date` can carry into the next second; whatever decodes must encode.
        guard SerializationFormat.unixTime(of: date) != nil else {
            throw corrupt("modification date seconds \(unix) are beyond ±2^53", at: offset)
        }
        return date
    }

    mutating func xattrs() throws -> [String: Data] {
        let countOffset = position
        let count = try integer(UInt32.self, "extended attribute count")
        guard UInt64(count) * UInt64(SerializationFormat.minimumXattrSize) <= UInt64(remaining) else {
            throw corrupt(
                "\(count) extended attributes cannot fit in the \(remaining) bytes left", at: countOffset)
        }
        var result: [String: Data] = [:]
        for _ in 0..<count {
            let (name, nameOffset) = try string(
                "extended attribute name", maximum: SerializationFormat.maximumXattrNameLength)
            if let problem = SerializationFormat.xattrNameProblem(name) {
                throw corrupt("extended attribute name \(name.debugDescription): \(problem)", at: nameOffset)
            }
            guard result[name] == nil else {
                throw corrupt("duplicate extended attribute \(name.debugDescription)", at: nameOffset)
            }
            let length = try integer(UInt32.self, "extended attribute length")
            try require(UInt64(length), "extended attribute value")
            result[name] = Data(bytes(Int(length)))
        }
        return result
    }

    mutating func children(depth: Int) throws -> [String: FileWrapper] {
        let countOffset = position
        let count = try integer(UInt32.self, "child count")
        guard UInt64(count) * UInt64(SerializationFormat.minimumChildSize) <= UInt64(remaining) else {
            throw corrupt("\(count) children cannot fit in the \(remaining) bytes left", at: countOffset)
        }
        guard count == 0 || depth < FileWrapper.maximumSerializationDepth else {
            throw corrupt(
                "directories nest deeper than \(FileWrapper.maximumSerializationDepth) levels",
                at: countOffset)
        }
        var children: [String: FileWrapper] = [:]
        for _ in 0..<count {
            let keyOffset = position
            let key = try name("key")
            // Swift String equality, as the children dictionary compares keys.
            guard children[key] == nil else {
                throw corrupt("duplicate key \(key.debugDescription)", at: keyOffset)
            }
            let node = try decodeNode(depth: depth + 1)
            let preferredName = try node.preferredFilename ?? derivedPreferredName(key, at: keyOffset)
            let child = FileWrapper(storage: node.storage, attributes: node.attributes)
            child.state.withLock { $0.preferredFilename = preferredName }
            child.adoptDecodedChildren()
            children[key] = child
        }
        return children
    }

    /// SR-3: a missing preferred name comes from the key, and must itself be a valid name (the
    /// key `1__#$!@%!#__..` would give "..").
    func derivedPreferredName(_ key: String, at offset: Int) throws -> String {
        let name = FileWrapper.preferredFilename(fromKey: key)
        if let problem = FileName.problem(with: name) {
            throw corrupt(
                "preferred name \(name.debugDescription) derived from key \(key.debugDescription): "
                    + problem,
                at: offset)
        }
        return name
    }

    func finish() throws {
        guard position == end else {
            throw corrupt("\(end - position) trailing bytes after the root node", at: position)
        }
    }
}

private func hex<T: BinaryInteger>(_ value: T) -> String {
    "0x" + String(value, radix: 16, uppercase: true)
}
