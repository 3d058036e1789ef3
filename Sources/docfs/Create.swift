import ArgumentParser
import DocumentEngine
import Foundation
import Logging
import PostgresStore
import SQLiteStore
import SampleDocuments

#if canImport(Glibc)
    import Glibc
#endif

/// `docfs create [STORE] [--demo] [--chunk-size N]`
struct Create: DocfsCommand {
    static let configuration = CommandConfiguration(
        abstract: "Create a document store.",
        discussion: """
            Creates the store file (mode 0600) and any missing parent folders (mode 0700). An \
            existing store is refused, except with --demo, which then only adds the demo \
            documents it lacks.

            --demo fills the store with sample documents: a MyStuff things document with \
            pictures, an ImageNotes document and two text documents.

            STORE may be a PostgreSQL URL, postgres://[user[:password]@]host[:port]/database \
            (PGHOST, PGPORT, PGUSER, PGPASSWORD and PGDATABASE fill in what it leaves out): \
            the database is created if the server has none of that name, and the store's \
            tables in it.
            """
    )

    @OptionGroup var global: GlobalOptions

    @Argument(help: "The store file or postgres:// URL to create (default: the default store).")
    var store: String?

    @Flag(help: "Add the demo documents.")
    var demo = false

    @Option(
        help: ArgumentHelp(
            "Bytes per content chunk, e.g. 65536, 64K or 1M (default: 256K); fixed for the store's life.",
            valueName: "n"))
    var chunkSize: ByteCountArgument?

    func validate() throws {
        // The store refuses chunk sizes over 64 MiB when it is opened; refuse them here first.
        if let chunkSize, chunkSize.bytes > 64 << 20 {
            throw ValidationError("the chunk size can be at most 64M")
        }
    }

    func run() async throws {
        let logger = global.bootstrap()
        let location = try StoreLocation(store)
        let path = location.path
        let store: any DocumentStore
        var st = stat()
        if let postgres = location.postgres {
            if let existing = try? PostgresStore(configuration: postgres, logger: logger) {
                store = existing
                guard demo else {
                    throw Failure("a store already exists at \(path); --demo adds the demo documents to it")
                }
            } else {
                if try PostgresStore.createDatabase(postgres, logger: logger) {
                    logger.info("created the database", metadata: ["url": "\(path)"])
                }
                store = try PostgresStore(
                    configuration: postgres, options: .create,
                    chunkSize: chunkSize?.bytes ?? SQLiteStore.defaultChunkSize, logger: logger)
                print("created the store \(path)")
            }
            if let chunkSize, chunkSize.bytes != store.chunkSize {
                throw Failure(
                    "the store at \(path) exists with a chunk size of \(store.chunkSize); it cannot change")
            }
        } else if stat(path, &st) == 0, st.st_size > 0 || (st.st_mode & S_IFMT) != S_IFREG {
            // Opening checks that it is a store before --demo writes to it.
            store = try location.open(logger: logger)
            guard demo else {
                throw Failure("a store already exists at \(path); --demo adds the demo documents to it")
            }
            if let chunkSize, chunkSize.bytes != store.chunkSize {
                throw Failure(
                    "the store at \(path) exists with a chunk size of \(store.chunkSize); it cannot change")
            }
        } else {
            try Self.makeParentFolders(of: path)
            logger.info("creating the store", metadata: ["path": "\(path)"])
            store = try SQLiteStore(
                path: path, options: .create, chunkSize: chunkSize?.bytes ?? SQLiteStore.defaultChunkSize)
            print("created the store \(path)")
        }
        if demo {
            let before = Set(try store.documents().map(\.name))
            try await DemoDocuments.populate(store)
            let added = try store.documents().map(\.name).filter { !before.contains($0) }
            if added.isEmpty {
                print("the store already has the demo documents")
            } else {
                print("added \(Format.count(added.count, "demo document")): \(added.joined(separator: ", "))")
            }
        }
    }

    /// Creates the missing folders above `path` with mode 0700 (a store is private data);
    /// existing folders are left as they are.
    static func makeParentFolders(of path: String) throws {
        let parent = (path as NSString).deletingLastPathComponent
        var missing: [String] = []
        var folder = parent
        var st = stat()
        while !folder.isEmpty, folder != "/", stat(folder, &st) != 0 {
            guard errno == ENOENT else {
                throw Failure(
                    "cannot create the store \(path): \(folder): \(String(cString: strerror(errno)))")
            }
            missing.append(folder)
            folder = (folder as NSString).deletingLastPathComponent
        }
        for folder in missing.reversed() where mkdir(folder, 0o700) != 0 && errno != EEXIST {
            throw Failure("cannot create the folder \(folder): \(String(cString: strerror(errno)))")
        }
    }
}
