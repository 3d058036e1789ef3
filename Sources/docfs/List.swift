import ArgumentParser
import DocumentEngine
import Foundation

/// `docfs ls [STORE] [DOCUMENT] [--deleted]`
struct List: DocfsCommand {
    static let configuration = CommandConfiguration(
        commandName: "ls",
        abstract: "List a store's documents, or a document's wrappers.",
        usage: """
            docfs ls [STORE] [--deleted]
            docfs ls [STORE] DOCUMENT
            """,
        discussion: """
            Without DOCUMENT: one line per document with its kind (package or flat), size (the \
            bytes of all its files), modification time, current version and name. With \
            --deleted: the deleted documents, with when they were deleted and their name in the \
            Trash of a mount (`.Trash-UID/files`), or "(emptied)" once the Trash was emptied of \
            them; they stay restorable until retention expires them.

            With DOCUMENT: its wrappers like `ls -l`: mode, size, modification time and path \
            inside the document, recursively; a link shows its destination.

            Reads no contents. A single argument is a STORE when it contains a "/" or ends in \
            ".docstore", otherwise a DOCUMENT of the default store.
            """
    )

    @OptionGroup var global: GlobalOptions

    @Argument(
        help: ArgumentHelp(
            "An optional STORE, then an optional DOCUMENT (see USAGE).", valueName: "store-or-document"))
    var arguments: [String] = []

    @Flag(help: "List deleted documents, which `docfs restore --undelete` brings back.")
    var deleted = false

    /// The store and document the arguments name.
    func resolved() throws -> (store: String?, document: String?) {
        let (store, document) = try Positionals.optionalStoreAndName(arguments, what: "DOCUMENT")
        return (store, document)
    }

    func validate() throws {
        if try resolved().document != nil, deleted {
            throw ValidationError("--deleted lists deleted documents; it takes no DOCUMENT")
        }
    }

    func run() async throws {
        let logger = global.bootstrap()
        let (storeArgument, documentName) = try resolved()
        let store = try StoreLocation(storeArgument).open(logger: logger)
        if let documentName {
            let info = try liveDocument(named: documentName, in: store)
            for line in try Self.wrapperLines(store.nodes(of: info.id), root: info.root, kind: info.kind) {
                print(line)
            }
        } else {
            let documents = deleted ? try store.deletedDocuments() : try store.documents()
            // The Trash of a mount shows the same deleted documents, under these names, until
            // it is emptied.
            let inTrash = deleted ? try store.trash().filter(\.isDocument) : []
            var rows: [[String]] = []
            for info in documents {
                // Metadata only: the sizes are the records', no chunk is read.
                let size = try store.nodes(of: info.id).reduce(Int64(0)) {
                    $0 + ($1.kind == .regularFile ? $1.size : 0)
                }
                var row = [
                    info.kind == .package ? "package" : "flat", "\(size)",
                    Format.time(deleted ? info.deleted ?? info.modified : info.modified),
                    "\(info.currentVersion.rawValue)",
                ]
                if deleted { row.append(inTrash.first { $0.document == info.id }?.name ?? "(emptied)") }
                rows.append(row + [info.name])
            }
            if rows.isEmpty { return }
            let header =
                deleted
                ? ["KIND", "SIZE", "DELETED", "VERSION", "IN TRASH AS", "NAME"]
                : ["KIND", "SIZE", "MODIFIED", "VERSION", "NAME"]
            for line in Format.table([header] + rows, rightAligned: [1, 3]) {
                print(line)
            }
        }
    }

    /// `ls -l`-style lines for a document's wrappers: a flat document's one file under its
    /// name, a package's wrappers (not its root) by path, parents before children, by name.
    static func wrapperLines(_ records: [NodeRecord], root: StoreNodeID, kind: DocumentKind) -> [String] {
        var children: [StoreNodeID: [NodeRecord]] = [:]
        var rootRecord: NodeRecord?
        for record in records {
            if record.id == root {
                rootRecord = record
            } else if let parent = record.parent {
                children[parent, default: []].append(record)
            }
        }
        var listed: [(NodeRecord, String)] = []
        if kind == .flat {
            if let rootRecord { listed.append((rootRecord, rootRecord.name)) }
        } else {
            // An explicit stack, not recursion: a deeply nested package must not exhaust the
            // call stack. `seen` guards against a damaged store whose parents form a cycle.
            var stack: [(StoreNodeID, String)] = [(root, "")]
            var seen: Set<StoreNodeID> = [root]
            while let (folder, prefix) = stack.popLast() {
                for record in children[folder] ?? [] {
                    let path = prefix + record.name
                    listed.append((record, path))
                    if record.kind == .directory, seen.insert(record.id).inserted {
                        stack.append((record.id, path + "/"))
                    }
                }
            }
            // Parents before children, siblings by name: sort by path components.
            listed.sort { $0.1.split(separator: "/").lexicographicallyPrecedes($1.1.split(separator: "/")) }
        }
        let rows = listed.map { record, path in
            [
                Format.mode(record), "\(record.size)", Format.time(record.modified),
                path + (record.linkTarget.map { " -> \($0)" } ?? ""),
            ]
        }
        return Format.table(rows, rightAligned: [1])
    }
}
