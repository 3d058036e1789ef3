import FUSE

#if canImport(Glibc)
    import Glibc
#endif

/// Names of the temporary, swap, lock and backup files editors and tools make beside the file
/// they save (docs/design/fuse-notes.md §3). Such files are real files in the mount but never
/// wrappers of the document: apps never see them, and renaming one onto a wrapper's name publishes
/// it.
public struct ScratchNames: Sendable {
    /// `fnmatch(3)` patterns, matched against the whole name.
    public var patterns: [String]

    /// The patterns of vim and nano (swap `.name.swp`…, and the `.name.swx` vim probes with, backups `name~`, vim's probe `4913`),
    /// emacs (`#name#`, `.#name`), GNU sed -i (`sedXXXXXX`), GIO (`.goutputstream-XXXXXX`),
    /// perl -i (`XXXXXXXX`), LibreOffice (`.~lock.name#`, `luXXX.tmp`), Kate (`name.kate-swp`),
    /// and rsync's `.name.XXXXXX` (see ``isRsyncTemporary(_:)``).
    public static let editors = [
        ".*.sw?", "*~", "#*#", ".#*", ".goutputstream-??????", "sed??????", "XX??????", ".~lock.*#",
        "lu*.tmp", "*.kate-swp",
    ]

    /// What other systems' file managers leave in every folder they show: macOS's Finder
    /// (`.DS_Store`, and `._name` AppleDouble files of resource forks and attributes on file
    /// systems without them) and Windows Explorer (`Thumbs.db`, `ehthumbs.db`, `desktop.ini`).
    /// They are caches and view settings, not the user's documents.
    public static let housekeeping = [".DS_Store", "._*", "[Tt]humbs.db", "ehthumbs.db", "[Dd]esktop.ini"]

    /// Editors' scratch files and file managers' housekeeping files.
    public static let standard = ScratchNames(patterns: editors + housekeeping)

    /// Editors' scratch files only: file managers' housekeeping files are kept
    /// (`-o housekeeping=keep`).
    public static let editorsOnly = ScratchNames(patterns: editors)

    public init(patterns: [String]) { self.patterns = patterns }

    /// rsync writes `.name.XXXXXX` (mkstemp: six random letters and digits) and renames it over
    /// `name`. A real extension of six characters (`.profile.backup`) is told apart by case:
    /// mkstemp's suffix mixes upper and lower case (or digits) in all but 0.5% of names, which
    /// then merely show up briefly as wrappers.
    static func isRsyncTemporary(_ bytes: [UInt8]) -> Bool {
        guard bytes.count >= 9, bytes[0] == 0x2E, bytes[bytes.count - 7] == 0x2E else { return false }
        let suffix = bytes.suffix(6)
        let isUpper = { (b: UInt8) in (0x41...0x5A).contains(b) }
        let isLowerOrDigit = { (b: UInt8) in (0x61...0x7A).contains(b) || (0x30...0x39).contains(b) }
        guard suffix.allSatisfy({ isUpper($0) || isLowerOrDigit($0) }) else { return false }
        return suffix.contains(where: isUpper) && suffix.contains(where: isLowerOrDigit)
    }

    /// Whether a file of this name is scratch.
    public func matches(_ name: FUSE.FileName) -> Bool {
        let bytes = name.bytes
        // vim's writability probe: 4913, then 4913 + 123·k (bufwrite.c).
        if bytes.count <= 6, !bytes.isEmpty, bytes.allSatisfy({ (0x30...0x39).contains($0) }),
            let n = Int(name.string), n >= 4913, (n - 4913) % 123 == 0
        {
            return true
        }
        if Self.isRsyncTemporary(bytes) { return true }
        return name.bytes.withUnsafeBufferPointer { raw -> Bool in
            var cName = Array(raw) + [0]
            return cName.withUnsafeMutableBufferPointer { cBuffer in
                cBuffer.withMemoryRebound(to: CChar.self) { c in
                    patterns.contains { fnmatch($0, c.baseAddress!, 0) == 0 }
                }
            }
        }
    }
}
