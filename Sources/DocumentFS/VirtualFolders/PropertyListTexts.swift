import DocumentEngine
import FUSE
import Foundation
import Logging
import SystemPackage
import Threading
import VersionedStore

/// `-o archives=xml`: binary property lists (keyed archives included) read as their XML text,
/// and text written to them is stored as a binary property list of the same kind again.
///
/// - **What is shown.** A regular file whose stored bytes start with `bplist00` and decode as a
///   property list within ``PropertyList/Limits/standard`` shows its XML text: its size, reads,
///   `mmap`. Finding out costs a read of the file's first 8 bytes the first time its attributes
///   are asked for; the text is made then, once per stored version (``TextViews``).
/// - **What is stored.** A written file is compiled at its save points (close, `fsync`, a rename
///   onto its name) outside the mount's lock. Text equal to what was shown stores nothing new, so
///   the archive stays byte for byte as the app wrote it; other text is stored as the binary
///   property list it stands for, checked as a keyed archive when the original was one.
/// - **What is refused.** Text that does not compile is refused with `EINVAL` at `close`,
///   `fsync` or the rename that would publish it, and the daemon logs the line and column (or
///   the archive rule) that failed. The store keeps the archive it had; the mount keeps the
///   refused text in the file, so a second open (the editor's retry, `cat`) sees it until it is
///   fixed or the mount ends; other mounts, `docfs export` and apps see the stored archive.
/// - **Editors that save a new file** (vim's rename mode, `sed -i`, GIO's safe save) keep the
///   binary form: a file renamed onto a shown property list, or created under the name one just
///   left in the same folder, is compiled as that property list was.
struct PropertyListTexts: MountRoom {
    let view: MountView
    /// The XML texts made so far, by stored version.
    let textViews = TextViews()
}

extension PropertyListTexts {
    /// Files larger than this are shown as stored (a property list that big is not for editing).
    static let largestTextView: Int64 = 16 << 20
    /// The smallest binary property list: the header, one object, a one-byte offset table and
    /// the trailer.
    static let smallestBinaryPropertyList: Int64 = 8 + 1 + 1 + 32

    /// Shows `node`'s stored bytes as XML text when they are a binary property list.
    func showAsText(_ node: ViewNode) throws(Errno) {
        guard configuration.archivesAsText else { return }
        let candidate = state.withLock { _ -> ContentBase? in
            let file = node.linkOf ?? node
            guard file.kind == .regularFile, let contents = file.contents, contents.base.text == nil,
                !contents.isModified, contents.base.version != nil,
                contents.base.size >= Self.smallestBinaryPropertyList,
                contents.base.size <= Self.largestTextView
            else { return nil }
            return contents.base
        }
        guard let base = candidate, let version = base.version else { return }
        let key = TextViews.Key(node: base.node, version: version)
        let text: PropertyListText?
        if let known = textViews.lookup(key) {
            text = known
        } else {
            let magic = try storeCall {
                try store.readContents(of: base.node, at: version, offset: 0, count: 8)
            }
            if PropertyList.isBinary(magic) {
                let bytes = try storeCall {
                    try store.readContents(of: base.node, at: version, offset: 0, count: Int(base.size))
                }
                text = PropertyListText(binary: bytes)
            } else {
                text = nil
            }
            textViews.insert(key, text)
        }
        guard let text else { return }
        let notices = state.withLock { _ -> [Notice] in
            let file = node.linkOf ?? node
            guard let contents = file.contents, contents.base == base, !contents.isModified else { return [] }
            let keptSize = contents.size
            contents.reset(
                to: ContentBase(node: base.node, version: version, size: Int64(text.text.count), text: text))
            contents.propertyList = text.kind
            // A kernel that already has the file keeps its stored size (writeback cache).
            var notices: [Notice] = []
            renew(file, &notices, keptSize: keptSize)
            if !notices.isEmpty { notices.append(.inode(file.ino)) }
            return notices
        }
        send(notices)
    }

    /// ``showAsText(_:)`` for every file of a directory, before a listing with attributes.
    func showChildrenAsText(_ directory: NodeID) throws(Errno) {
        guard configuration.archivesAsText else { return }
        let files = try state.withLock { state throws(Errno) -> [ViewNode] in
            guard let directory = try node(&state, directory) else {
                return state.rootEntries.values.filter { $0.kind == .regularFile }
            }
            return directory.children.values.filter { $0.kind == .regularFile }
        }
        for file in files { try showAsText(file) }
    }

    /// Compiles the written text of `file` unless its last compile is current; returns the
    /// outcome (nil when the file is not a shown property list, or is unchanged).
    @discardableResult
    func compileText(_ file: ViewNode) throws(Errno) -> Result<PropertyListText, PropertyListTextError>? {
        let job = state.withLock {
            _ -> (PropertyListText.Kind, UInt64, PropertyListText?, FileContents.ReadPlan)? in
            guard let contents = file.contents, let kind = contents.propertyList, contents.isModified else {
                return nil
            }
            if let compiled = contents.compiled, compiled.edits == contents.edits { return nil }
            let plan = contents.planRead(offset: 0, count: Int(clamping: contents.size))
            return (kind, contents.edits, contents.base.text ?? contents.replaces, plan)
        }
        guard let (kind, edits, shown, plan) = job else {
            return state.withLock { _ in file.contents?.compiled?.outcome }
        }
        let text = Data(try read(plan))
        let outcome: Result<PropertyListText, PropertyListTextError>
        do {
            // The text that was shown, unchanged: the bytes it was made from, as the app wrote them.
            let binary =
                text == shown?.text ? shown?.binary ?? Data() : try PropertyListText.compile(text, as: kind)
            outcome = .success(PropertyListText(binary: binary, text: text, kind: kind))
        } catch {
            outcome = .failure(error)
            let name = state.withLock { _ in file.name.string }
            logger.error("\(name): the text was not stored, \(error)")
        }
        state.withLock { _ in
            guard let contents = file.contents, contents.edits == edits else { return }
            contents.compiled = (edits, outcome)
        }
        return outcome
    }

    /// Compiles the written property lists among a document's changed files, before a save.
    func compileTexts(of document: DocumentState) {
        guard configuration.archivesAsText else { return }
        let files = state.withLock { _ in
            document.touched.values.filter {
                $0.contents?.propertyList != nil && $0.contents?.isModified == true
            }
        }
        for file in files { _ = try? compileText(file) }
    }

    /// Refuses a save point of `file` whose text does not compile (`EINVAL`).
    func checkText(_ file: ViewNode) throws(Errno) {
        guard configuration.archivesAsText else { return }
        if case .failure = try compileText(file) { throw .invalidArgument }
    }

    /// A shown property list leaves `name` in `directory`: a file created there under that name
    /// soon after (vim's rename mode) is stored as one too.
    func noteLeaving(_ state: inout State, _ node: ViewNode, name: FUSE.FileName, directory: ViewNode?) {
        guard let contents = node.contents, let kind = contents.propertyList else { return }
        state.formerPropertyLists[FormerName(directory: directory?.ino ?? mountRootInode, name: name)] = (
            kind, contents.base.text ?? contents.replaces
        )
    }

    /// A regular file created as `name` in `directory` takes over the kind of the property list
    /// that left that name.
    func inheritPropertyList(
        _ state: inout State, _ node: ViewNode, name: FUSE.FileName, directory: ViewNode?
    ) {
        guard configuration.archivesAsText, node.kind == .regularFile else { return }
        let key = FormerName(directory: directory?.ino ?? mountRootInode, name: name)
        if let (kind, shown) = state.formerPropertyLists.removeValue(forKey: key) {
            node.contents?.propertyList = kind
            node.contents?.replaces = shown
        }
    }
}

/// A name a shown property list left (``PropertyListTexts/noteLeaving(_:_:name:directory:)``).
struct FormerName: Hashable {
    var directory: UInt64
    var name: FUSE.FileName
}

/// The XML texts of binary property lists, by stored node and version (nil: not one), so that
/// a text is made once per saved version however often it is opened. Bounded: past the limit
/// it starts afresh.
final class TextViews: Sendable {
    struct Key: Hashable {
        var node: StoreNodeID
        var version: VersionID
    }

    private struct Entries {
        var texts: [Key: PropertyListText?] = [:]
        var bytes = 0
    }

    private let entries = Locked(.leaf, Entries())
    static let byteLimit = 64 << 20
    static let countLimit = 200_000

    func lookup(_ key: Key) -> PropertyListText?? { entries.withLock { $0.texts[key] } }

    func insert(_ key: Key, _ text: PropertyListText?) {
        entries.withLock { entries in
            let size = (text?.text.count ?? 0) + (text?.binary.count ?? 0)
            if entries.bytes + size > Self.byteLimit || entries.texts.count >= Self.countLimit {
                entries = Entries()
            }
            entries.texts[key] = .some(text)
            entries.bytes += size
        }
    }
}
