/* ingest._engine: the native engine. A batch goes from the sampler's dataset indices to the finished device batch
 * on native threads that never take the GIL; the training process's Python touches each batch once, to take it.
 *
 *   reader thread      takes the next batch of the epoch queued by Python (add_epoch), lays its byte ranges out in
 *                      a pinned host arena, reads them with preadv on the read team (preadv.h), parses each record
 *                      (WHOLE: the range is the image; RECORDIO: the IRHeader; TFRECORD: the framing and the
 *                      tf.train.Example's image and label features, example_scan.h; CAFFE_DATUM: an encoded Datum's
 *                      data and label fields; FRAMED: our LMDB layout's record of an image, a label and (where
 *                      the table gives its fields' kind codes) a mask, walked field by field; PIXELS: a
 *                      raw shard's decoded uint8 [H, W, 3] pixels, of the table's `hw`: nothing to parse or
 *                      scan), scans the JPEG header (jpeg_scan.h; a PNG image's IHDR instead where png_decode.h
 *                      takes it), plans the op chain (plan.h: draws, regions to decode, output sizes),
 *                      decodes the PNG images whole on the read team into a pinned image arena (png_decode.h as
 *                      an image: RGB, the CPU decoder's pixels exactly), the JPEGs the GPU path does not take
 *                      whole into the same arena with nvImageCodec's CPU decoder (`cpu`: one call per batch,
 *                      host_jpeg, decode_host_jpegs; an oriented one turned into place on the read team, turn)
 *                      and, with masks, decodes the batch's PNG masks on the read team into a
 *                      pinned mask arena (png_decode.h): a TFRecord table's mask key names them inside each record,
 *                      a FRAMED table's mask kind code (10) the field holding them;
 *                      a WHOLE table's mask ranges (a WebDataset mask member) are read into the arena beside their
 *                      images (one read where the mask follows its image closely), their CRC32Cs checked
 *   decode thread      decodes the batch's regions with nvImageCodec into a device arena, split over the decode team
 *                      (one thread per nvImageCodec decoder, nvloop.h; host pixels are copied to the device arena
 *                      in one copy instead: a PIXELS batch's read arena, a batch's host image arena, each sample's
 *                      pixels then read where they landed, whole), then takes a
 *                      free output slot, packs the warp kernel's arguments (plan.h), uploads them and the labels
 *                      from pinned memory, launches the fused warp + normalize kernel into the slot's output (and,
 *                      with masks, uploads them and launches the nearest warp on them with the same plans into the
 *                      slot's mask output) and queues a host function behind it that puts the batch on the ready
 *                      queue once the GPU has run it (cuLaunchHostFunc)
 *   Python (next)      takes a finished batch (waiting for one with the GIL released when none is ready) and
 *                      returns (kind, slot, epoch, number, rows, notes); it makes no CUDA call, so the training
 *                      thread never holds the GIL while the driver's locks are contended by the engine's threads
 *
 * Without a `gpu` argument (dry mode) the decode thread stops after planning and writes each row's plan into the
 * slot's `dry` array instead (no CUDA is touched), so that reads, parsing, header scans and plans are testable on
 * any machine.
 *
 * Rows. A batch's samples keep their order; a sample that cannot be read is dropped natively and reported as a
 * note (index, row -1, NOTE_READ, -errno or the bytes read, bytes wanted); so is one whose bytes do not have the
 * CRC32C given for it (`crcs`: over exactly the bytes read, the record's whole range; computed by the read team as
 * each range lands, crc32c.h), as (index, row -1, NOTE_CORRUPT, CRC computed, CRC given), and a TFRecord record
 * whose own masked CRC32C of its length or data fails (`record_crc`), as (index, row -1, NOTE_CORRUPT, 1 for the
 * length's or 2 for the data's, 0). A sample the table leaves to Python (`python`: not read), and a sample the engine
 * does not decode (not a baseline/extended 8-bit JPEG of 1 or 3 YCbCr components ending in EOI, unoriented, nor
 * a JPEG nvImageCodec's CPU decoder takes (host_jpeg: 8-bit Huffman-coded JPEGs of 1, 3 or 4 components ending in
 * EOI, oriented or not; WHY_HEADER, or WHY_ORIENTED without a CPU decoder), nor a PNG png_decode.h decodes as an
 * image (a PNG it leaves to Pillow or refuses falls back too), more than max_pixels, a record its format's parse
 * leaves to the Python reader (a split or damaged
 * RecordIO record, a TFRecord record that is not a canonical Example holding the keys, a Datum that is not a plain
 * encoded one), a mask the engine does not decode (WHY_MASK: not a PNG png_decode.h decodes, 16-bit, refused, or
 * not its image's size; a mask range read short or whose CRC32C differs), or one nvImageCodec refuses on the GPU or
 * the CPU, WHY_DECODER) keeps its row and is reported as a note (index, row, NOTE_FALLBACK, why, nvImageCodec
 * status): Python fills that row. A row whose image was decoded on the host (a PNG, a JPEG by the CPU decoder) is
 * reported as (index, row, NOTE_HOST, 0, 0) (the decode paths' count). With `host_share` > 0 the CPU decoder also
 * takes that share of the JPEGs the GPU would decode, picked by a hash of their dataset index (host_share_pick).
 *
 * Output slots. Python hands over `slots` output buffers (set_slot: device addresses of an output tensor and a
 * label tensor, host arrays for the rows' indices, padding flags and, dry, plans) and gets slot k back from
 * next(); it gives it back with release(k, stream) once nothing of the user's holds it (the slot reaches the engine
 * with the next next() call, which takes the engine's lock anyway: waking the engine's threads from the training
 * thread at every drop cost it more than the rest of its per-batch work). The decode thread records the slot's
 * free event on that stream when it takes the slot again and makes its kernel wait for it: recorded later than
 * the drop, it covers at least the work the consumer queued before the drop. While every slot is out and nothing is ready, next() returns None ("starved") so that
 * Python can replace a held slot's tensors (set_slot) and release it.
 *
 * Device memory the engine owns: two decode arenas (cuMemAlloc, sized from the first batch's need and a quarter, in
 * 2 MiB steps, grown only) and per slot the kernel's argument buffer. nvImageCodec does not order its writes after
 * work queued on its stream, so an arena is decoded into only after the host has seen the event recorded after the
 * last kernel that read it.
 *
 * libcuda is dlopen'ed at run time; nvImageCodec's function addresses, handles and struct layouts and the warp
 * kernel's CUfunction handles come from Python (ingest/native.py; a PIXELS table's `gpu` is the device and the
 * kernels alone; the CPU decoder's, `gpu`'s optional last item, in the same form: its library may be another's), so this builds with a C compiler and Python's headers alone. A forked child cannot use an engine
 * of its parent's (its threads did not fork): every method raises there, and the child's copy is dropped without
 * touching its locks.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "crc32c.h"
#include "dlsyms.h"
#include "example_scan.h"
#include "jpeg_scan.h"
#include "nvloop.h"
#include "plan.h"
#include "png_decode.h"
#include "preadv.h"
#include "random_core.h"
#include "record_parse.h"

enum { FMT_WHOLE = 0, FMT_RECORDIO = 1, FMT_TFRECORD = 2, FMT_CAFFE_DATUM = 3, FMT_FRAMED = 4, FMT_PIXELS = 5,
       FMT_COUNT };
enum { ST_OK = 0, ST_FAILED = 1, ST_FALLBACK = 2 };
enum { NOTE_READ = 1, NOTE_FALLBACK = 2, NOTE_CORRUPT = 3, NOTE_HOST = 4 };
enum { HOST_PNG = 1, HOST_JPEG = 2 }; /* Job.on_host */
/* why a sample falls back */
enum { WHY_HEADER = 1, WHY_ORIENTED = 2, WHY_RECORD = 3, WHY_DECODER = 4, WHY_PLAN = 5, WHY_MASK = 6,
       WHY_BOXES = 7 /* a record with more boxes than the slots hold (engine_det.h) */ };
enum { R_BATCH = 0, R_EPOCH = 1 };
/* dry-mode columns per row */
enum { D_INDEX, D_LABEL, D_STATUS, D_H, D_W, D_RX0, D_RY0, D_RX1, D_RY1, D_DX0, D_DY0, D_DX1, D_DY1, D_OH, D_OW,
       D_PAD, D_COLS };

#define NO_STREAM (~0ULL) /* a slot not given back yet: nothing of the consumer's to wait for */
#define QCAP 256          /* entries of the decode and ready queues (batches are bounded by jobs and slots) */
#define JOBS 3            /* host batches in flight: being read, waiting, being decoded */
#define ARENAS 2          /* device decode arenas: one decoded into while the kernel reads the other */

/* Where each batch's time goes (stats: "stage_ms", the mean per batch; "first_stage_ms", each of the first
 * T_FIRST batches). The reader thread: waiting for a free job (and for the GPU to finish reading its host arenas),
 * its reads, the rest of its work (parse, header scan, plan, host decodes), waiting for room in the decode queue.
 * The decode thread: waiting for a read batch, for a device arena the kernel has finished reading, nvImageCodec's
 * decode of the batch (with the host pixels' upload), waiting for a free output slot (and for its last uploads
 * to have run), the rest (packing and uploading the kernel's arguments, the launches). */
enum { T_JOB, T_READ, T_PREPARE, T_QUEUE, T_IDLE, T_ARENA, T_DECODE, T_SLOT, T_OUTPUT, T_COUNT };
static const char *const T_NAMES[T_COUNT] = {"reader_wait_job", "read", "prepare", "reader_wait_queue",
                                             "decoder_wait_batch", "wait_arena", "decode", "wait_slot", "output"};
#define T_FIRST 64
#define ALIGN 768         /* each image's start in an arena: 256-byte aligned and a whole number of RGB pixels */
#define ARENA_STEP ((size_t)2 << 20)
#define KEEP_OPEN_FILES 4096 /* sources of at most this many files keep them open */

/* -- the CUDA driver, loaded at run time ------------------------------------------------------------------ */

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext, *CUstream, *CUevent, *CUfunction;

static struct {
    void *lib;
    CUresult (*Init)(unsigned);
    CUresult (*DeviceGet)(CUdevice *, int);
    CUresult (*PrimaryRetain)(CUcontext *, CUdevice);
    CUresult (*PrimaryRelease)(CUdevice);
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*CtxPush)(CUcontext);
    CUresult (*CtxPop)(CUcontext *);
    CUresult (*StreamCreate)(CUstream *, unsigned);
    CUresult (*StreamDestroy)(CUstream);
    CUresult (*StreamSynchronize)(CUstream);
    CUresult (*StreamWaitEvent)(CUstream, CUevent, unsigned);
    CUresult (*EventCreate)(CUevent *, unsigned);
    CUresult (*EventDestroy)(CUevent);
    CUresult (*EventRecord)(CUevent, CUstream);
    CUresult (*EventSynchronize)(CUevent);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemFree)(CUdeviceptr);
    CUresult (*MemHostAlloc)(void **, size_t, unsigned);
    CUresult (*MemFreeHost)(void *);
    CUresult (*MemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
    CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             CUstream, void **, void **);
    CUresult (*LaunchHostFunc)(CUstream, void (*)(void *), void *);
    CUresult (*GetErrorString)(CUresult, const char **);
} cu;

#define CU_STREAM_NON_BLOCKING 0x1u
#define CU_EVENT_DISABLE_TIMING 0x2u

/* Loads libcuda once (called with the GIL held); NULL or a message saying what is missing. The environment
 * variable INGEST_CUDA_LIBRARY names another library to load instead (the tests' CPU stand-in). */
static const char *load_cuda(void) {
    if (cu.lib != NULL)
        return NULL;
    const char *name = getenv("INGEST_CUDA_LIBRARY");
    const ing_symbol names[] = {
        {"cuInit", (void **)&cu.Init}, {"cuDeviceGet", (void **)&cu.DeviceGet},
        {"cuDevicePrimaryCtxRetain", (void **)&cu.PrimaryRetain},
        {"cuDevicePrimaryCtxRelease_v2", (void **)&cu.PrimaryRelease},
        {"cuCtxSetCurrent", (void **)&cu.CtxSetCurrent}, {"cuCtxPushCurrent_v2", (void **)&cu.CtxPush},
        {"cuCtxPopCurrent_v2", (void **)&cu.CtxPop}, {"cuStreamCreate", (void **)&cu.StreamCreate},
        {"cuStreamDestroy_v2", (void **)&cu.StreamDestroy}, {"cuStreamSynchronize", (void **)&cu.StreamSynchronize},
        {"cuStreamWaitEvent", (void **)&cu.StreamWaitEvent}, {"cuEventCreate", (void **)&cu.EventCreate},
        {"cuEventDestroy_v2", (void **)&cu.EventDestroy}, {"cuEventRecord", (void **)&cu.EventRecord},
        {"cuEventSynchronize", (void **)&cu.EventSynchronize}, {"cuMemAlloc_v2", (void **)&cu.MemAlloc},
        {"cuMemFree_v2", (void **)&cu.MemFree}, {"cuMemHostAlloc", (void **)&cu.MemHostAlloc},
        {"cuMemFreeHost", (void **)&cu.MemFreeHost}, {"cuMemcpyHtoDAsync_v2", (void **)&cu.MemcpyHtoDAsync},
        {"cuLaunchKernel", (void **)&cu.LaunchKernel}, {"cuGetErrorString", (void **)&cu.GetErrorString},
        {"cuLaunchHostFunc", (void **)&cu.LaunchHostFunc},
    };
    int missing;
    void *lib = ing_dlopen_all(name && name[0] ? name : "libcuda.so.1", names, sizeof names / sizeof names[0],
                               &missing);
    if (lib == NULL)
        return missing ? "libcuda.so.1 lacks a driver function the engine calls"
                       : "cannot load libcuda.so.1 (or INGEST_CUDA_LIBRARY)";
    cu.lib = lib;
    return NULL;
}

/* -- the engine's state ------------------------------------------------------------------------------------ */

/* -- detection's state (the functions: engine_det.h) ------------------------------------------------------- */

#define DET_FIELDS 8      /* per-box fields and per-sample int fields, each */
#define DET_HEAD 32       /* int64s before the rows in a slot's detection info array */

/* A batch's boxes, gathered after its read (det_gather: from the table or from each record), and through ing_plan:
 * the planned samples' boxes (ltrb of the probed images), the kept ones. */
typedef struct {
    double *sbox;             /* n x most x 4: sample k's boxes from row k * most (ltrb in pixels of its image) */
    int64_t *scount;          /* n: sample k's boxes */
    unsigned char *sfv[DET_FIELDS]; /* n x most values of each per-box field, as sbox */
    int64_t *ssv[DET_FIELDS]; /* n: each per-sample field's value */
    int64_t *side;            /* the record scan's list values */
    double *in, *out;         /* M x 4 each */
    int64_t *grow;            /* M: each row of `in`'s row in sbox (gathers the per-box fields) */
    int64_t *kept;            /* M */
    int64_t *counts, *kept_counts, *first; /* per planned sample q: boxes given, kept, first kept row of `out` */
    int64_t *q_of;            /* per sample k of the batch: q, or -1 where not planned */
    int64_t row_elems;        /* this batch's output elements between rows */
    ing_boxes boxes;
} DetJob;

/* Where the boxes come from (set_detection): the dataset's table, or each record's scan; and the slots' target
 * buffers (set_targets). */
typedef struct {
    int on, format, relative, batchwide, nfields, nsample;
    int record;               /* 1: each record's Object Detection API features (rq), else the table below */
    ex_request rq;            /* record: the boxes' keys (xmin, ymin, xmax, ymax, height, width), the fields' */
    char rkinds[EX_MAX_KEYS + 1], *rkey_block;
    int64_t nbox, most, stride; /* most: the boxes a sample may have (the table's most, the record bound) */
    double *boxes;            /* nbox x 4: absolute ltrb of each image's declared (= probed) size */
    int64_t *starts;          /* n + 1 */
    int64_t *declared;        /* n x 2 (height, width): a probed size that differs falls back; NULL: none */
    int64_t fsize[DET_FIELDS];
    unsigned char *fvals[DET_FIELDS];
    unsigned char fpad[DET_FIELDS][8];
    int64_t *svals[DET_FIELDS];
    Py_buffer *thost, *tinfo; /* per slot: the staged targets (pinned with a GPU), the info Python reads */
    char *theld;
    CUdeviceptr *tdev;
    size_t *tbytes;           /* per slot: the bytes staged for its batch */
} Det;

typedef struct Epoch {
    struct Epoch *next;
    int64_t epoch, number0, batches;
    int64_t *indices, *bounds; /* bounds: batches + 1 positions in indices */
    uint8_t *pad;
} Epoch;

typedef struct {
    int64_t index, row, stage, code, status;
} Note;

typedef struct {
    int64_t epoch, number, n;
    int64_t *index, *label, *off, *want, *got, *crc, *img, *hdr, *hw, *ok_pos, *ok_index, *ok_hw;
    int64_t *mask;         /* per sample: its mask's encoded bytes (offset in `host`, length; -1 none), then its
                              decoded values' offset in `mhost` */
    int64_t *mcrc;         /* per sample: the CRC32C of its mask range's bytes (mask_crcs) */
    uint8_t *pad;
    int32_t *state, *why;
    uint32_t *status;      /* nvImageCodec's per-image status of a refused image */
    Note *notes;           /* the batch's read failures */
    int64_t nnotes;
    ing_sample *plan;      /* per sample k (valid while state[k] == ST_OK) */
    ing_sample *ok_plan;   /* ing_plan's output over the samples planned */
    int64_t nok;
    int32_t interpolation, antialias;
    unsigned char *host;   /* the read arena (pinned with a GPU) */
    size_t cap;
    CUevent done;          /* recorded after the GPU work that reads `host` */
    int recorded;
    int arena;             /* the device arena its images were decoded into */
    int64_t next_task;     /* the read team's next sample */
    ing_png *png;          /* per sample: its mask's decode */
    ing_png *ipng;         /* per sample: its image's decode, where the read team decodes it (on_host) */
    uint8_t *on_host;      /* per sample: where its image is decoded on the host, not by nvImageCodec on the GPU:
                              HOST_PNG (png_decode.h) or HOST_JPEG (nvImageCodec's CPU decoder) */
    int64_t *pix;          /* per sample (on_host): where its decoded pixels lie in `phost` */
    int64_t *stored;       /* per sample (HOST_JPEG, oriented): where its stored (unturned) pixels lie in `phost` */
    unsigned char *phost;  /* the images decoded on the host (pinned with a GPU), uploaded in one copy; past ptotal
                              the stored pixels of oriented JPEGs, turned into place before the upload */
    size_t pcap, ptotal;
    unsigned char *mhost;  /* the decoded masks (pinned with a GPU), uploaded to `mdev` for their warp */
    size_t mcap, mtotal;
    CUdeviceptr mdev;
    size_t mdev_cap;
    DetJob det;            /* detection (engine_det.h) */
    int64_t t[T_COUNT];    /* nanoseconds in each stage (T_*), filled by the reader, then the decode thread */
} Job;

typedef struct Engine Engine;
typedef void (*team_fn)(Engine *, int);

typedef struct Team Team;
typedef struct {
    Team *team;
    int id;
} TeamArg;

/* Threads that run fn(engine, id) once per round (`team_run`), the caller being id 0. */
struct Team {
    pthread_mutex_t lock;
    pthread_cond_t wake, done;
    unsigned long round;
    int running, started, stop, size;
    team_fn fn;
    Engine *engine;
    pthread_t *threads;
    TeamArg *args;
};

/* nvImageCodec's structs as the engine writes them: sizes and field offsets (from the ctypes binding) */
typedef struct {
    ptrdiff_t info_stride, view_stride, probe_size, off_buffer, off_stream, off_h, off_w, off_row, off_start,
        off_end, off_codec;
} NvLayout;

typedef struct {
    void *handle;
    ing_nv_slots slots;
    void **streams, **images;
    ptrdiff_t *picked;
    uint32_t *statuses, *out;
    const unsigned char **ptrs;
    size_t *lens;
    int32_t *regions;
    int64_t first, count; /* this batch's share of the GPU list */
    int call;             /* nvimgcodecDecoderDecode's status */
} Decoder;

typedef struct {
    int kind, slot;
    int64_t epoch, number, rows;
} Ready;

/* A ready-queue entry waiting on the GPU: the host function queued after a batch's last work puts it on the queue. */
typedef struct Posted {
    Engine *e;
    Ready r;
} Posted;

struct Engine {
    PyObject_HEAD
    pid_t pid;
    int closed;
    /* the table */
    int64_t n, nfiles;
    char **paths;
    char *path_block;
    int64_t *files, *offsets, *sizes, *labels;
    int64_t *pixel_hw;    /* PIXELS: each sample's height and width (its range holds uint8 [H, W, 3], dense) */
    uint32_t *crcs;       /* each record's CRC32C, checked as read (NULL: none) */
    uint8_t *python;      /* 1 where the table leaves a sample to Python (NULL: none) */
    ex_request keys;      /* TFRECORD: the image key ('b') and, where given, the label key ('i') */
    char *key_block;
    int record_crc;       /* TFRECORD: check the records' own masked CRC32Cs */
    unsigned char framed[FRAMED_MAX]; /* FRAMED: its records' field kind codes in order (default: image, int) */
    int nframed;
    int mask_cell;        /* TFRECORD: the keys' index of the mask's key (one bytes value, a PNG); FRAMED: the
                             mask's field's (kind 10, a PNG); -1: no mask */
    int64_t *mask_off, *mask_size; /* WHOLE: each sample's mask, a byte range of its own in the image's file (a
                                      WebDataset member), read with the image (NULL: none) */
    uint32_t *mask_crcs;  /* WHOLE with mask ranges: each mask range's CRC32C, checked as read (NULL: none) */
    int masks;            /* a mask rides with each image (mask_cell >= 0 or mask_off) */
    ing_chain mchain;     /* the chain for the masks: one uint8 channel, no Normalize, the mask's fill */
    ing_png_worker *png_workers; /* one per read team member */
    int host_png;         /* zlib loaded: PNG images are decoded on the read team (png_decode.h) */
    int *fds;
    int keep_open, format;
    ing_chain chain;
    int64_t batch, nslots, max_pixels, out_h, out_w, row_elems;
    int regions;
    int nice;             /* added to each engine thread's nice value (0: unchanged) */
    double host_share;    /* the share of the GPU path's JPEGs decoded on the host instead (host_share_pick) */
    /* queues and their one lock */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int stop, users; /* users: Python calls inside a method (close waits for them) */
    char error[512];
    Epoch *epochs, *epochs_tail;
    Job jobs[JOBS];
    Job *free_jobs[JOBS];
    int nfree_jobs;
    struct {
        Job *job;
        int64_t epoch;
    } dq[QCAP];
    int dq_head, dq_len;
    Ready rq[QCAP];
    int rq_head, rq_len;
    int *free_slots;
    char *slot_given; /* 1 while a slot is Python's (from next() to release()); GIL-protected, as are: */
    int *pending;     /* slots released, handed to the engine by the next next() (its lock taken once a batch) */
    int npending;
    int nfree_slots, starving;
    int64_t inflight;            /* batches queued on the GPU whose host function has not put them on the ready queue */
    struct Posted *posted;       /* QCAP ready entries for host functions, used in turn by the decode thread */
    int64_t nposted;
    unsigned long long *slot_stream; /* the stream each slot was released on (release), its free event recorded there */
    /* per slot */
    Py_buffer *slot_idx, *slot_pad, *slot_dry;
    char *slot_held; /* 3 flags per slot: which of the buffers above are held */
    CUdeviceptr *slot_out, *slot_lbl, *slot_args, *slot_mask;
    unsigned char **slot_host; /* pinned (host memory dry): labels (batch int64), then the kernel's arguments */
    Note **slot_notes;
    int64_t *slot_nnotes;
    CUevent *slot_ready, *slot_free;
    /* threads */
    Team readers, decoders;
    pthread_t reader, decoder;
    int reader_started, decoder_started, teams_made;
    Job *reading;
    /* GPU */
    int gpu;
    CUdevice dev;
    CUcontext ctx;
    CUstream stream;
    ing_nv_functions nv;
    int (*image_destroy)(void *), (*stream_destroy)(void *);
    void *instance, *params;
    Decoder *dec;
    int ndec;
    /* nvImageCodec's CPU decoder (`cpu`; NULL handle: none): the JPEGs the GPU path does not take, decoded on the
     * reader thread into the host image arena (decode_host_jpegs), with the functions of its own library */
    Decoder hdec;
    NvLayout hlay;
    ing_nv_functions hnv;
    int (*h_image_destroy)(void *), (*h_stream_destroy)(void *);
    void *hinstance, *hparams;
    int64_t *hpos;        /* the reader thread's scratch: the sample of each image in hdec's list */
    NvLayout lay;         /* the GPU decoders' struct layouts */
    CUfunction kernels[3];
    CUdeviceptr arena[ARENAS];
    size_t arena_cap[ARENAS];
    CUevent arena_ev[ARENAS];
    int arena_used[ARENAS];
    int64_t batches_decoded;
    /* the decode thread's per-batch scratch */
    int64_t *g_pos, *g_reg, *g_org, *g_dec, *g_aoff, *g_row, *p_org, *p_dec, *p_row, *p_pos, *p_hw;
    int64_t *g_nv;        /* the GPU list's entries nvImageCodec decodes (not a host image's), in order */
    uint64_t *p_src;
    ing_sample *p_plan;
    /* counts */
    int64_t st_batches, st_samples, st_fallbacks, st_failures, st_bytes, st_arena_allocs, st_starved;
    int64_t t_sum[T_COUNT], t_first[T_FIRST][T_COUNT]; /* stage times (T_*): totals, the first batches' */
    /* The consumer's side, changed only with the GIL held: nanoseconds next() and release() held the GIL, the part
     * of it in CUDA driver calls, and the batches next() handed over. */
    int64_t gil_ns, handed;
    Det det; /* detection (engine_det.h); det.on 0 otherwise */
};

static int64_t mono_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* -- errors ------------------------------------------------------------------------------------------------ */

/* Stops the engine with a message (the first one is kept); next() raises it once the ready batches are taken. */
static void fail(Engine *e, const char *fmt, ...) {
    pthread_mutex_lock(&e->lock);
    if (!e->error[0]) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(e->error, sizeof e->error, fmt, ap);
        va_end(ap);
    }
    e->stop = 1;
    pthread_cond_broadcast(&e->cond);
    pthread_mutex_unlock(&e->lock);
}

static int cuok(Engine *e, CUresult r, const char *what) {
    if (r == 0)
        return 1;
    const char *text = NULL;
    if (cu.GetErrorString == NULL || cu.GetErrorString(r, &text) != 0 || text == NULL)
        text = "unknown error";
    fail(e, "CUDA driver call %s failed: %s (CUresult %d)", what, text, r);
    return 0;
}

/* Names the calling engine thread (as `top -H` and /proc show it) and adds the engine's nice value to its own (Linux:
 * per thread), so that the training thread, which launches the model's kernels, wins the cores when they are short. */
static void engine_thread_start(const Engine *e, const char *name) {
    pthread_setname_np(pthread_self(), name);
    if (e->nice > 0) {
        errno = 0;
        int base = getpriority(PRIO_PROCESS, 0);
        if (errno == 0)
            setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), base + e->nice > 19 ? 19 : base + e->nice);
    }
}

/* -- teams ------------------------------------------------------------------------------------------------- */

static void *team_main(void *arg) {
    TeamArg *a = arg;
    Team *t = a->team;
    unsigned long seen = 0; /* rounds start at 1: a thread that starts late still takes the round it was made for */
    engine_thread_start(t->engine, "ingest-team");
    if (t->engine->gpu)
        cu.CtxSetCurrent(t->engine->ctx);
    pthread_mutex_lock(&t->lock);
    for (;;) {
        while (t->round == seen && !t->stop)
            pthread_cond_wait(&t->wake, &t->lock);
        if (t->round == seen)
            break; /* stopped with no round pending (a pending round is always finished) */
        seen = t->round;
        pthread_mutex_unlock(&t->lock);
        t->fn(t->engine, a->id);
        pthread_mutex_lock(&t->lock);
        if (--t->running == 0)
            pthread_cond_broadcast(&t->done);
    }
    pthread_mutex_unlock(&t->lock);
    return NULL;
}

/* A team of `size` threads, the caller included; 0 on success. */
static int team_init(Team *t, Engine *e, int size) {
    memset(t, 0, sizeof *t);
    t->engine = e;
    t->size = size < 1 ? 1 : size;
    if (pthread_mutex_init(&t->lock, NULL) || pthread_cond_init(&t->wake, NULL) || pthread_cond_init(&t->done, NULL))
        return -1;
    t->threads = calloc((size_t)t->size, sizeof(pthread_t));
    t->args = calloc((size_t)t->size, sizeof(TeamArg));
    if (t->threads == NULL || t->args == NULL)
        return -1;
    for (int k = 1; k < t->size; ++k) {
        t->args[k].team = t;
        t->args[k].id = k;
        if (pthread_create(&t->threads[k], NULL, team_main, &t->args[k]) != 0)
            return -1;
        t->started++;
    }
    return 0;
}

/* Runs fn on every member once, the caller as member 0; returns when all are done. */
static void team_run(Team *t, team_fn fn) {
    pthread_mutex_lock(&t->lock);
    t->fn = fn;
    t->running = t->started;
    t->round++;
    pthread_cond_broadcast(&t->wake);
    pthread_mutex_unlock(&t->lock);
    fn(t->engine, 0);
    pthread_mutex_lock(&t->lock);
    while (t->running > 0)
        pthread_cond_wait(&t->done, &t->lock);
    pthread_mutex_unlock(&t->lock);
}

/* Joins the team's threads (no round may be running: the coordinators are joined first). */
static void team_stop(Team *t) {
    if (t->threads == NULL)
        return;
    pthread_mutex_lock(&t->lock);
    t->stop = 1;
    pthread_cond_broadcast(&t->wake);
    pthread_mutex_unlock(&t->lock);
    for (int k = 1; k <= t->started; ++k)
        pthread_join(t->threads[k], NULL);
    free(t->threads);
    free(t->args);
    t->threads = NULL;
    t->args = NULL;
    pthread_cond_destroy(&t->wake);
    pthread_cond_destroy(&t->done);
    pthread_mutex_destroy(&t->lock);
}

/* -- reading ----------------------------------------------------------------------------------------------- */

/* An open descriptor of file f (kept open for sources of few files), or -errno. */
static int open_file(Engine *e, int64_t f) {
    if (!e->keep_open) {
        int fd = open(e->paths[f], O_RDONLY | O_CLOEXEC);
        return fd < 0 ? -errno : fd;
    }
    int fd = __atomic_load_n(&e->fds[f], __ATOMIC_ACQUIRE);
    if (fd >= 0)
        return fd;
    fd = open(e->paths[f], O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    int expected = -1;
    if (!__atomic_compare_exchange_n(&e->fds[f], &expected, fd, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        close(fd); /* another thread opened it first */
        return expected;
    }
    return fd;
}

static void done_with(Engine *e, int fd) {
    if (!e->keep_open && fd >= 0)
        close(fd);
}

/* The read team's next sample of the job being read for a member to work on, or -1 once all are taken: each
 * sample goes to one member, in order of asking. */
static inline int64_t team_next(Job *j) {
    int64_t k = __atomic_fetch_add(&j->next_task, 1, __ATOMIC_RELAXED);
    return k < j->n ? k : -1;
}

/* Runs fn on the read team over job j's samples (each member taking them with team_next until none is left). */
static void team_over(Engine *e, Job *j, team_fn fn) {
    e->reading = j;
    j->next_task = 0;
    team_run(&e->readers, fn);
}

/* Team member: the sizes of whole-file samples (size -1 in the table). */
static void stat_fn(Engine *e, int id) {
    Job *j = e->reading;
    for (int64_t k; (k = team_next(j)) >= 0;) {
        if (j->want[k] >= 0)
            continue;
        int64_t i = j->index[k];
        int fd = open_file(e, e->files[i]);
        struct stat st;
        if (fd < 0) {
            j->got[k] = fd;
        } else if (fstat(fd, &st) != 0) {
            j->got[k] = -errno;
        } else {
            int64_t left = (int64_t)st.st_size - e->offsets[i];
            j->want[k] = left > 0 ? left : 0;
        }
        if (j->got[k] < 0)
            j->state[k] = ST_FAILED;
        done_with(e, fd);
    }
}

/* Where sample k's mask range lands in the read arena, after its image's (read_batch): right behind the image's bytes
 * with the bytes between them where it follows the image closely in the file (then one read takes both), else at the
 * next 64-byte boundary. Returns the bytes the sample takes from j->off[k]. */
#define MASK_GAP ((int64_t)1 << 16)
static int64_t place_mask(Engine *e, Job *j, int64_t k) {
    int64_t i = j->index[k], len = j->want[k], gap = e->mask_off[i] - e->offsets[i] - len;
    int64_t at = gap >= 0 && gap <= MASK_GAP ? len + gap : (len + 63) & ~(int64_t)63;
    j->mask[2 * k] = j->off[k] + at;
    j->mask[2 * k + 1] = -1;
    return at + e->mask_size[i];
}

/* Sample k's image and mask ranges into the arena where place_mask put them: one read where the mask follows the
 * image closely (the bytes between land in the arena too), else two. The mask's length read is j->mask[2k + 1] (-1
 * where the read failed or came short: Python reads the sample and names that); its CRC32C is j->mcrc[k]. */
static void read_with_mask(Engine *e, Job *j, int64_t k, int fd) {
    int64_t i = j->index[k], len = j->want[k], mlen = e->mask_size[i], at = j->mask[2 * k] - j->off[k];
    uint64_t addr = (uint64_t)(uintptr_t)(j->host + j->off[k]), maddr = addr + (uint64_t)at;
    int64_t mgot;
    if (e->mask_off[i] == e->offsets[i] + at) {
        int64_t span = at + mlen, got = ing_preadv_full(fd, e->offsets[i], &addr, &span, 1, NULL);
        j->got[k] = got < len ? got : len;
        mgot = got < 0 ? -1 : got - at;
    } else {
        j->got[k] = ing_preadv_full(fd, e->offsets[i], &addr, &len, 1, NULL);
        mgot = ing_preadv_full(fd, e->mask_off[i], &maddr, &mlen, 1, NULL);
    }
    j->mask[2 * k + 1] = mgot == mlen ? mlen : -1;
    if (e->mask_crcs != NULL && mgot == mlen)
        j->mcrc[k] = ing_crc32c(0, j->host + j->mask[2 * k], (size_t)mlen);
}

/* Team member: each sample's bytes into the host arena. */
static void read_fn(Engine *e, int id) {
    Job *j = e->reading;
    for (int64_t k; (k = team_next(j)) >= 0;) {
        if (j->state[k] != ST_OK)
            continue;
        int64_t i = j->index[k], len = j->want[k];
        if (len == 0) {
            j->got[k] = 0;
            continue;
        }
        int fd = open_file(e, e->files[i]);
        if (fd < 0) {
            j->got[k] = fd;
            continue;
        }
        uint64_t addr = (uint64_t)(uintptr_t)(j->host + j->off[k]);
        if (e->mask_off != NULL)
            read_with_mask(e, j, k, fd);
        else
            j->got[k] = ing_preadv_full(fd, e->offsets[i], &addr, &len, 1, NULL);
        done_with(e, fd);
        if (e->crcs != NULL && j->got[k] == j->want[k])
            j->crc[k] = ing_crc32c(0, j->host + j->off[k], (size_t)j->got[k]);
        else if (e->record_crc && j->got[k] == j->want[k])
            j->crc[k] = tfrecord_check(j->host + j->off[k], j->got[k]);
    }
}

static void note(Job *j, Note *notes, int64_t *count, int64_t k, int64_t row, int64_t stage, int64_t code,
                 int64_t status) {
    notes[*count] = (Note){j->index[k], row, stage, code, status};
    ++*count;
}

/* A job's host arena (*host, of *cap bytes: the read arena or the mask arena) of at least `need` bytes, pinned
 * with a GPU (its GPU reads are over: take_job waited). */
static int ensure_host(Engine *e, unsigned char **host, size_t *cap, size_t need, const char *what) {
    if (need <= *cap && *host != NULL)
        return 1;
    size_t size = need + need / 4 + 4096;
    if (e->gpu) {
        if (*host != NULL)
            cu.MemFreeHost(*host);
        *host = NULL;
        *cap = 0;
        if (!cuok(e, cu.MemHostAlloc((void **)host, size, 0), "cuMemHostAlloc")) {
            *host = NULL;
            return 0;
        }
    } else {
        free(*host);
        *cap = 0;
        if ((*host = malloc(size)) == NULL) {
            fail(e, "out of host memory for a %s of %zu bytes", what, size);
            return 0;
        }
    }
    *cap = size;
    return 1;
}

static int read_batch(Engine *e, Job *j) {
    int stat = 0;
    for (int64_t k = 0; k < j->n; ++k) {
        int64_t i = j->index[k];
        j->want[k] = e->sizes[i];
        j->got[k] = 0;
        j->crc[k] = 0;
        j->state[k] = ST_OK;
        j->why[k] = 0;
        j->status[k] = 0;
        j->on_host[k] = 0;
        if (e->python != NULL && e->python[i]) { /* not read: Python reads it and names what is wrong */
            j->state[k] = ST_FALLBACK;
            j->why[k] = WHY_RECORD;
            j->want[k] = 0;
        }
        stat |= j->want[k] < 0;
    }
    if (stat)
        team_over(e, j, stat_fn);
    size_t total = 0;
    for (int64_t k = 0; k < j->n; ++k) {
        j->off[k] = (int64_t)total;
        if (j->state[k] == ST_OK)
            total += ((size_t)(e->mask_off != NULL ? place_mask(e, j, k) : j->want[k]) + 63) & ~(size_t)63;
    }
    if (!ensure_host(e, &j->host, &j->cap, total, "read arena"))
        return 0;
    team_over(e, j, read_fn);
    return 1;
}

/* -- parsing and probing ----------------------------------------------------------------------------------- */

/* The image of a record of `format` (not FMT_WHOLE), the label it holds and (a TFRecord or framed table with a mask)
 * its mask's start and length in mask[0..1] (else untouched); 0 where Python's reader decides. */
static int record_image(const Engine *e, const unsigned char *p, int64_t len, int64_t *start, int64_t *end,
                        int64_t *label, int64_t *mask) {
    switch (e->format) {
    case FMT_RECORDIO:
        return recordio_image(p, len, start, end, label);
    case FMT_TFRECORD:
        return tfrecord_image(p, len, &e->keys, e->mask_cell, start, end, label, mask);
    case FMT_CAFFE_DATUM:
        return datum_image(p, len, start, end, label);
    default:
        return framed_image(p, len, e->framed, e->nframed, e->mask_cell, start, end, label, mask);
    }
}

/* decode_gpu.gpu_decodable, and orientation 1 (the GPU path decodes only images that need no turning; host_jpeg takes
 * the others where the engine has a CPU decoder). */
static int why_not_gpu(const int64_t *row, int64_t max_pixels) {
    int64_t pixels = row[1] * row[2];
    if (row[0] != 1 || row[8] != 1 || (row[5] != 0xC0 && row[5] != 0xC1) || row[4] != 8 ||
        (row[3] != 1 && row[3] != 3) || row[7] != 0 || pixels <= 0 || pixels > max_pixels)
        return WHY_HEADER;
    return row[6] != 1 ? WHY_ORIENTED : 0;
}

/* Whether sample k's image (p, len bytes) is a PNG whose header png_decode.h takes as an RGB image of at most
 * max_pixels: then the read team decodes it (decode_host), its header row the PNG's size. */
static int host_image(Engine *e, Job *j, int64_t k, const unsigned char *p, int64_t len) {
    ing_png *png = &j->ipng[k];
    memset(png, 0, sizeof *png);
    png->data = p;
    png->len = (size_t)len;
    png->rgb = 1;
    png->offset = -1;
    if (!e->host_png || ing_png_header(png) != ING_PNG_DECODED ||
        (int64_t)png->width * (int64_t)png->height > e->max_pixels)
        return 0;
    int64_t *row = j->hdr + ING_JPEG_COLUMNS * k;
    memset(row, 0, ING_JPEG_COLUMNS * sizeof(int64_t));
    row[1] = png->height;
    row[2] = png->width;
    j->on_host[k] = HOST_PNG;
    return 1;
}

/* Whether a JPEG the GPU path does not take (header row `row`) is one that nvImageCodec's CPU decoder (its
 * libjpeg-turbo extension) decodes to the CPU decoder's pixels exactly: 8-bit, Huffman-coded (baseline, extended or
 * progressive), of 1, 3 (YCbCr or RGB) or 4 (CMYK or YCCK) components, ending in EOI, of at most max_pixels. Then
 * the reader thread decodes it (decode_host_jpegs) and turns it by its orientation, its header row's size the
 * turned one (the size the Python stages plan with). */
static int host_jpeg(Engine *e, Job *j, int64_t k, int64_t *row) {
    int64_t pixels = row[1] * row[2];
    if (e->hdec.handle == NULL || row[0] != 1 || row[8] != 1 || row[4] != 8 ||
        (row[5] != 0xC0 && row[5] != 0xC1 && row[5] != 0xC2) || (row[3] != 1 && row[3] != 3 && row[3] != 4) ||
        pixels <= 0 || pixels > e->max_pixels || row[6] < 1 || row[6] > 8)
        return 0;
    if (row[6] >= 5) {
        int64_t h = row[1];
        row[1] = row[2];
        row[2] = h;
    }
    j->on_host[k] = HOST_JPEG;
    return 1;
}

/* Whether dataset index i is among the `share` of the GPU path's JPEGs the host decoder takes instead: a hash of
 * the index alone, so the same images go every epoch and whatever the batch. */
static int host_share_pick(int64_t i, double share) {
    return share > 0 && ing_unit(ing_combine(0x686F73744A504547ULL /* "hostJPEG" */, (uint64_t)i)) < share;
}

/* The bytes of the mask arena: each GPU row's mask header checked (a mask the native decoder leaves to Pillow or
 * refuses, of 16-bit values, or of another size than its image's leaves its sample to Python, WHY_MASK, whose
 * decode stage takes it or names what is wrong with it: masks.py, decode.py) and its place set in j->mask[2k]. */
static size_t place_masks(Job *j) {
    size_t total = 0;
    for (int64_t k = 0; k < j->n; ++k) {
        if (j->state[k] != ST_OK)
            continue;
        ing_png *png = &j->png[k];
        memset(png, 0, sizeof *png);
        png->data = j->host + j->mask[2 * k];
        png->len = (size_t)j->mask[2 * k + 1];
        png->offset = -1;
        if (j->mask[2 * k + 1] <= 0 || ing_png_header(png) != ING_PNG_DECODED || png->depth == 16 ||
            png->height != (uint32_t)j->hw[2 * k] || png->width != (uint32_t)j->hw[2 * k + 1]) {
            j->state[k] = ST_FALLBACK;
            j->why[k] = WHY_MASK;
            continue;
        }
        j->mask[2 * k] = (int64_t)total; /* (its encoded bytes are png->data now) */
        total += ((size_t)png->width * png->height + 255) & ~(size_t)255;
    }
    return total;
}

/* Team member: the batch's PNGs, each GPU row's image where it is one (HOST_PNG) and its mask (with masks). */
static void png_fn(Engine *e, int id) {
    Job *j = e->reading;
    for (int64_t k; (k = team_next(j)) >= 0;) {
        if (j->state[k] != ST_OK)
            continue;
        if (j->on_host[k] == HOST_PNG)
            ing_png_decode(&j->ipng[k], &e->png_workers[id]);
        if (e->masks)
            ing_png_decode(&j->png[k], &e->png_workers[id]);
    }
}

static void put_ptr(char *base, ptrdiff_t off, const void *value) { memcpy(base + off, &value, sizeof value); }

/* Turns the stored pixels `src` (sh x sw RGB) by EXIF orientation o (2-8) into `dst`, as cpu.py's _ORIENT does
 * (Pillow's exif_transpose): transposed for 5-8, the stored rows reversed for 3, 4, 6, 7, its columns for 2, 3, 7, 8. */
static void turn(const uint8_t *src, int64_t sh, int64_t sw, int o, uint8_t *dst) {
    int t = o >= 5, rows = o == 3 || o == 4 || o == 6 || o == 7, cols = o == 2 || o == 3 || o == 7 || o == 8;
    int64_t dh = t ? sw : sh, dw = t ? sh : sw;
    int64_t step = t ? (rows ? -3 * sw : 3 * sw) : (cols ? -3 : 3); /* the stored pixel of the next x */
    for (int64_t y = 0; y < dh; ++y) {
        int64_t sy = t ? 0 : y, sx = t ? y : 0;
        if (rows)
            sy = sh - 1 - sy;
        if (cols)
            sx = sw - 1 - sx;
        const uint8_t *s = src + 3 * (sy * sw + sx);
        uint8_t *d = dst + 3 * dw * y;
        for (int64_t x = 0; x < dw; ++x, s += step, d += 3) {
            d[0] = s[0];
            d[1] = s[1];
            d[2] = s[2];
        }
    }
}

/* Team member: the batch's oriented JPEGs decoded on the host, turned from their stored pixels into place. */
static void turn_fn(Engine *e, int id) {
    (void)id;
    Job *j = e->reading;
    for (int64_t k; (k = team_next(j)) >= 0;) {
        const int64_t *row = j->hdr + ING_JPEG_COLUMNS * k;
        if (j->state[k] != ST_OK || j->on_host[k] != HOST_JPEG || row[6] == 1)
            continue;
        int o = (int)row[6];
        int64_t sh = o >= 5 ? row[2] : row[1], sw = o >= 5 ? row[1] : row[2];
        turn(j->phost + j->stored[k], sh, sw, o, j->phost + j->pix[k]);
    }
}

/* The batch's HOST_JPEG images decoded by nvImageCodec's CPU decoder in one call from the reader thread (its own
 * threads share the work), each whole into its place in the host image arena, or (oriented) into its stored place
 * past it, then turned into place on the read team. One it refuses falls back as WHY_DECODER with its status: the
 * Python stages decode it on the CPU or name what is wrong with it. */
static void decode_host_jpegs(Engine *e, Job *j) {
    Decoder *dc = &e->hdec;
    ptrdiff_t n = 0;
    int turned = 0;
    for (int64_t k = 0; k < j->n; ++k) {
        if (j->state[k] != ST_OK || j->on_host[k] != HOST_JPEG)
            continue;
        const int64_t *row = j->hdr + ING_JPEG_COLUMNS * k;
        int stored = row[6] != 1;
        uint32_t h = (uint32_t)(row[6] >= 5 ? row[2] : row[1]), w = (uint32_t)(row[6] >= 5 ? row[1] : row[2]);
        size_t stride = (size_t)w * 3;
        char *info = dc->slots.infos + n * e->hlay.info_stride;
        put_ptr(info, e->hlay.off_buffer, j->phost + (stored ? j->stored[k] : j->pix[k]));
        put_ptr(info, e->hlay.off_stream, NULL);
        memcpy(info + e->hlay.off_h, &h, sizeof h);
        memcpy(info + e->hlay.off_w, &w, sizeof w);
        memcpy(info + e->hlay.off_row, &stride, sizeof stride);
        dc->ptrs[n] = j->host + j->img[2 * k];
        dc->lens[n] = (size_t)j->img[2 * k + 1];
        memset(dc->regions + 4 * n, 0, 4 * sizeof(int32_t));
        e->hpos[n++] = k;
    }
    if (n == 0)
        return;
    ing_nv_run(&e->hnv, e->hinstance, dc->handle, e->hparams, n, dc->ptrs, dc->lens, dc->regions, &dc->slots,
               dc->out, dc->streams, dc->images, dc->picked, dc->statuses);
    for (ptrdiff_t i = 0; i < n; ++i) {
        int64_t k = e->hpos[i];
        if (dc->out[i] != ING_NV_SUCCESS) {
            j->state[k] = ST_FALLBACK;
            j->why[k] = WHY_DECODER;
            j->status[k] = dc->out[i];
        } else {
            turned |= j->hdr[ING_JPEG_COLUMNS * k + 6] != 1;
        }
    }
    if (turned)
        team_over(e, j, turn_fn);
}

/* The images the GPU path leaves to the host, decoded in one round of the read team (PNGs: host_image) and one
 * call of nvImageCodec's CPU decoder (JPEGs: host_jpeg), each whole, uint8 [H, W, 3] at an ALIGN step of the host
 * image arena, which decode_batch uploads in one copy beside nvImageCodec's GPU decodes (the kernel warps each as a
 * whole decode), and (with masks) their masks into the host mask arena at their images' probed size (place_masks).
 * A PNG the decoder leaves to Pillow or refuses falls back as WHY_HEADER (Python's CPU decode takes it or names
 * what is wrong), a JPEG as WHY_DECODER, a mask as WHY_MASK. 0 (the engine stopped) where an arena cannot be had. */
static int decode_host(Engine *e, Job *j) {
    size_t mtotal = e->masks ? place_masks(j) : 0, ptotal = 0, total;
    int jpegs = 0, pngs = mtotal > 0;
    for (int64_t k = 0; k < j->n; ++k)
        if (j->state[k] == ST_OK && j->on_host[k]) {
            const int64_t *row = j->hdr + ING_JPEG_COLUMNS * k;
            pngs |= j->on_host[k] == HOST_PNG;
            j->pix[k] = (int64_t)ptotal;
            ptotal += ((size_t)row[1] * (size_t)row[2] * 3 + ALIGN - 1) / ALIGN * ALIGN;
        }
    total = ptotal;
    for (int64_t k = 0; k < j->n; ++k)
        if (j->state[k] == ST_OK && j->on_host[k] == HOST_JPEG) {
            const int64_t *row = j->hdr + ING_JPEG_COLUMNS * k;
            jpegs = 1;
            if (row[6] != 1) { /* its stored pixels, turned into place once decoded */
                j->stored[k] = (int64_t)total;
                total += ((size_t)row[1] * (size_t)row[2] * 3 + ALIGN - 1) / ALIGN * ALIGN;
            }
        }
    j->mtotal = mtotal;
    j->ptotal = ptotal;
    if (mtotal + total == 0)
        return 1;
    if ((mtotal && !ensure_host(e, &j->mhost, &j->mcap, mtotal, "mask arena")) ||
        (total && !ensure_host(e, &j->phost, &j->pcap, total, "image arena")))
        return 0;
    for (int64_t k = 0; k < j->n; ++k)
        if (j->state[k] == ST_OK) {
            if (j->on_host[k] == HOST_PNG)
                j->ipng[k].out = j->phost + j->pix[k];
            if (e->masks)
                j->png[k].out = j->mhost + j->mask[2 * k];
        }
    if (pngs)
        team_over(e, j, png_fn);
    for (int64_t k = 0; pngs && k < j->n; ++k) {
        if (j->state[k] != ST_OK)
            continue;
        int image = j->on_host[k] == HOST_PNG && j->ipng[k].status != ING_PNG_DECODED;
        if (image || (e->masks && j->png[k].status != ING_PNG_DECODED)) {
            j->state[k] = ST_FALLBACK;
            j->why[k] = image ? WHY_HEADER : WHY_MASK;
        }
    }
    if (jpegs)
        decode_host_jpegs(e, j);
    return 1;
}

/* Parses, probes and plans a read batch; notes go to the job's own list (copied to the slot later). */
#include "engine_det.h"

static int prepare_batch(Engine *e, Job *j) {
    Note *notes = j->notes;
    int64_t *nnotes = &j->nnotes;
    *nnotes = 0;
    for (int64_t k = 0; k < j->n; ++k) {
        if (j->state[k] == ST_OK && (j->got[k] < 0 || j->got[k] < j->want[k]))
            j->state[k] = ST_FAILED;
        if (j->state[k] == ST_FAILED) {
            note(j, notes, nnotes, k, -1, NOTE_READ, j->got[k], j->want[k]);
            continue;
        }
        int64_t i = j->index[k], start = 0, stop = j->got[k], label = e->labels ? e->labels[i] : -1;
        j->label[k] = label;
        if (j->state[k] == ST_FALLBACK) /* left to Python by the table */
            continue;
        if (e->crcs != NULL && (uint32_t)j->crc[k] != e->crcs[i]) {
            j->state[k] = ST_FAILED;
            note(j, notes, nnotes, k, -1, NOTE_CORRUPT, j->crc[k], e->crcs[i]);
            continue;
        }
        if (e->record_crc && (j->crc[k] == TF_LENGTH_CRC || j->crc[k] == TF_DATA_CRC)) {
            j->state[k] = ST_FAILED; /* (code: which CRC; Python names it) */
            note(j, notes, nnotes, k, -1, NOTE_CORRUPT, j->crc[k], 0);
            continue;
        }
        const unsigned char *p = j->host + j->off[k];
        if (e->mask_off != NULL) { /* read beside the image: a short read or a CRC32C that differs is Python's */
            if (j->mask[2 * k + 1] < 0 || (e->mask_crcs != NULL && (uint32_t)j->mcrc[k] != e->mask_crcs[i])) {
                j->state[k] = ST_FALLBACK;
                j->why[k] = WHY_MASK;
                continue;
            }
        } else {
            j->mask[2 * k] = 0;
            j->mask[2 * k + 1] = -1;
        }
        if (e->format == FMT_PIXELS) { /* decoded pixels: the table's size, no header to scan */
            int64_t *row = j->hdr + ING_JPEG_COLUMNS * k;
            memset(row, 0, ING_JPEG_COLUMNS * sizeof(int64_t));
            row[1] = j->hw[2 * k] = e->pixel_hw[2 * i];
            row[2] = j->hw[2 * k + 1] = e->pixel_hw[2 * i + 1];
            j->img[2 * k] = j->off[k];
            j->img[2 * k + 1] = j->got[k];
            continue;
        }
        if (e->format != FMT_WHOLE) {
            int64_t own = -1, mask[2] = {0, -1};
            if (!record_image(e, p, j->got[k], &start, &stop, &own, mask)) {
                j->state[k] = ST_FALLBACK;
                j->why[k] = WHY_RECORD;
                continue;
            }
            if (e->labels == NULL)
                j->label[k] = own;
            j->mask[2 * k] = j->off[k] + mask[0];
            j->mask[2 * k + 1] = mask[1];
        }
        j->img[2 * k] = j->off[k] + start;
        j->img[2 * k + 1] = stop - start;
        int64_t *row = j->hdr + ING_JPEG_COLUMNS * k;
        ing_jpeg_scan(p + start, stop - start, row);
        int why = why_not_gpu(row, e->max_pixels);
        if (why == WHY_HEADER && host_image(e, j, k, p + start, stop - start))
            why = 0; /* a PNG the read team decodes (decode_host) */
        else if (why && host_jpeg(e, j, k, row))
            why = 0; /* a JPEG nvImageCodec's CPU decoder decodes (decode_host_jpegs) */
        else if (!why && host_share_pick(i, e->host_share))
            host_jpeg(e, j, k, row); /* one the GPU takes, decoded on the host instead (where it can be) */
        if (why) {
            j->state[k] = ST_FALLBACK;
            j->why[k] = why;
            continue;
        }
        j->hw[2 * k] = row[1];
        j->hw[2 * k + 1] = row[2];
    }
    det_gather(e, j);
    /* plan the samples the GPU path takes */
    int64_t m = 0;
    for (int64_t k = 0; k < j->n; ++k)
        if (j->state[k] == ST_OK) {
            j->ok_pos[m] = k;
            j->ok_index[m] = j->index[k];
            j->ok_hw[2 * m] = j->hw[2 * k];
            j->ok_hw[2 * m + 1] = j->hw[2 * k + 1];
            ++m;
        }
    j->nok = m;
    j->interpolation = ING_NEAREST;
    j->antialias = 0;
    if (m > 0) {
        ing_plan_out out = {.sample = j->ok_plan, .params = NULL};
        out.boxes = det_boxes(e, j, m);
        int st = ing_plan(&e->chain, m, j->ok_index, j->epoch, j->ok_hw, &out);
        if (st != ING_OK) {
            fail(e, "the native planner failed on batch %lld of epoch %lld: %s", (long long)j->number,
                 (long long)j->epoch, ing_strerror(st));
            return 0;
        }
        j->interpolation = out.interpolation;
        j->antialias = out.antialias;
        det_planned(e, j, m);
        for (int64_t q = 0; q < m; ++q) {
            int64_t k = j->ok_pos[q];
            j->plan[k] = j->ok_plan[q];
            if (e->det.on ? det_too_big(e, &j->ok_plan[q])
                          : j->ok_plan[q].out_hw[0] != e->out_h || j->ok_plan[q].out_hw[1] != e->out_w) {
                j->state[k] = ST_FALLBACK; /* not the chain's fixed output size: Python plans it */
                j->why[k] = WHY_PLAN;
            }
        }
    }
    return decode_host(e, j);
}

/* -- queues ------------------------------------------------------------------------------------------------ */

static Job *take_job(Engine *e) {
    pthread_mutex_lock(&e->lock);
    while (e->nfree_jobs == 0 && !e->stop)
        pthread_cond_wait(&e->cond, &e->lock);
    Job *j = e->stop ? NULL : e->free_jobs[--e->nfree_jobs];
    pthread_mutex_unlock(&e->lock);
    if (j != NULL && e->gpu && j->recorded && !cuok(e, cu.EventSynchronize(j->done), "cuEventSynchronize"))
        return NULL; /* (the job is lost to the pool: the engine is stopping anyway) */
    return j;
}

static void give_job(Engine *e, Job *j) {
    pthread_mutex_lock(&e->lock);
    e->free_jobs[e->nfree_jobs++] = j;
    pthread_cond_broadcast(&e->cond);
    pthread_mutex_unlock(&e->lock);
}

/* Queues a batch (job) or an epoch's end (job NULL) for the decode thread; 0 once stopping. */
static int push_decode(Engine *e, Job *j, int64_t epoch) {
    int64_t t0 = mono_ns();
    pthread_mutex_lock(&e->lock);
    while (e->dq_len == QCAP && !e->stop)
        pthread_cond_wait(&e->cond, &e->lock);
    if (j != NULL)
        j->t[T_QUEUE] = mono_ns() - t0;
    int ok = !e->stop;
    if (ok) {
        int at = (e->dq_head + e->dq_len++) % QCAP;
        e->dq[at].job = j;
        e->dq[at].epoch = epoch;
        pthread_cond_broadcast(&e->cond);
    }
    pthread_mutex_unlock(&e->lock);
    return ok;
}

static int push_ready(Engine *e, Ready r, int posted) {
    pthread_mutex_lock(&e->lock);
    while (e->rq_len == QCAP && !e->stop)
        pthread_cond_wait(&e->cond, &e->lock);
    int ok = !e->stop;
    if (ok)
        e->rq[(e->rq_head + e->rq_len++) % QCAP] = r;
    e->inflight -= posted;
    pthread_cond_broadcast(&e->cond);
    pthread_mutex_unlock(&e->lock);
    return ok;
}

/* (a host function: runs on the driver's thread once the work queued before it ran; calls no CUDA) */
static void post_ready(void *arg) {
    Posted *p = arg;
    push_ready(p->e, p->r, 1);
}

/* Puts r on the ready queue once the work queued on the engine's stream so far has run (at once in dry mode): a
 * batch reaches next() finished, so the consumer's thread makes no CUDA call to wait for it, and an epoch's end
 * stays behind its last batch. Decode thread only. */
static int post(Engine *e, Ready r) {
    if (!e->gpu)
        return push_ready(e, r, 0);
    Posted *p = &e->posted[e->nposted++ % QCAP]; /* (entries in flight are bounded by the slots and epochs) */
    p->e = e;
    p->r = r;
    pthread_mutex_lock(&e->lock);
    e->inflight++;
    pthread_mutex_unlock(&e->lock);
    if (!cuok(e, cu.LaunchHostFunc(e->stream, post_ready, p), "cuLaunchHostFunc")) {
        pthread_mutex_lock(&e->lock);
        e->inflight--;
        pthread_mutex_unlock(&e->lock);
        return 0;
    }
    return 1;
}

/* A free output slot (waiting, and saying so to next(), while every slot is out); -1 once stopping. */
static int take_slot(Engine *e) {
    pthread_mutex_lock(&e->lock);
    while (e->nfree_slots == 0 && !e->stop) {
        if (!e->starving) {
            e->starving = 1;
            e->st_starved++;
            pthread_cond_broadcast(&e->cond);
        }
        pthread_cond_wait(&e->cond, &e->lock);
    }
    e->starving = 0;
    int slot = e->stop ? -1 : e->free_slots[--e->nfree_slots];
    pthread_mutex_unlock(&e->lock);
    return slot;
}

/* -- the reader thread ------------------------------------------------------------------------------------- */

static void *reader_main(void *arg) {
    Engine *e = arg;
    engine_thread_start(e, "ingest-reader");
    if (e->gpu && !cuok(e, cu.CtxSetCurrent(e->ctx), "cuCtxSetCurrent"))
        return NULL;
    for (;;) {
        pthread_mutex_lock(&e->lock);
        while (e->epochs == NULL && !e->stop)
            pthread_cond_wait(&e->cond, &e->lock);
        Epoch *ep = e->stop ? NULL : e->epochs;
        pthread_mutex_unlock(&e->lock);
        if (ep == NULL)
            return NULL;
        for (int64_t b = 0; b < ep->batches; ++b) {
            int64_t t0 = mono_ns();
            Job *j = take_job(e);
            if (j == NULL)
                return NULL;
            int64_t t1 = mono_ns();
            memset(j->t, 0, sizeof j->t);
            j->t[T_JOB] = t1 - t0;
            int64_t first = ep->bounds[b];
            j->epoch = ep->epoch;
            j->number = ep->number0 + b;
            j->n = ep->bounds[b + 1] - first;
            memcpy(j->index, ep->indices + first, (size_t)j->n * sizeof(int64_t));
            memcpy(j->pad, ep->pad + first, (size_t)j->n);
            int ok = read_batch(e, j);
            int64_t t2 = mono_ns();
            j->t[T_READ] = t2 - t1;
            ok = ok && prepare_batch(e, j);
            j->t[T_PREPARE] = mono_ns() - t2;
            if (!ok || !push_decode(e, j, -1)) {
                give_job(e, j);
                return NULL;
            }
        }
        if (!push_decode(e, NULL, ep->epoch))
            return NULL;
        pthread_mutex_lock(&e->lock);
        e->epochs = ep->next;
        if (e->epochs == NULL)
            e->epochs_tail = NULL;
        pthread_mutex_unlock(&e->lock);
        free(ep->indices);
        free(ep->bounds);
        free(ep->pad);
        free(ep);
    }
}

/* -- decoding and the kernel ------------------------------------------------------------------------------- */

/* Destroys the nvImageCodec handles a decoder's slots hold (its images, region and whole code streams). */
static void decoder_destroy(Engine *e, Decoder *dc, int (*image_destroy)(void *), int (*stream_destroy)(void *)) {
    for (int64_t i = 0; dc->slots.parents && i < e->batch; ++i) {
        if (dc->slots.images[i])
            image_destroy(dc->slots.images[i]);
        if (dc->slots.subs[i])
            stream_destroy(dc->slots.subs[i]);
        if (dc->slots.parents[i])
            stream_destroy(dc->slots.parents[i]);
    }
}

/* Team member: decoder `id` decodes its share of the batch's GPU list. */
static void decode_fn(Engine *e, int id) {
    Decoder *d = &e->dec[id];
    d->call = 0;
    if (d->count > 0)
        d->call = ing_nv_run(&e->nv, e->instance, d->handle, e->params, (ptrdiff_t)d->count, d->ptrs, d->lens,
                             d->regions, &d->slots, d->out, d->streams, d->images, d->picked, d->statuses);
}

/* The next device arena for job j, of at least `need` bytes, once the kernel that last read it has run; -1 (the
 * engine stopped) where it cannot be had. */
static int take_arena(Engine *e, Job *j, size_t need) {
    int a = (int)(e->batches_decoded++ % ARENAS);
    j->arena = a;
    int64_t t0 = mono_ns();
    if (e->arena_used[a] && !cuok(e, cu.EventSynchronize(e->arena_ev[a]), "cuEventSynchronize"))
        return -1;
    j->t[T_ARENA] = mono_ns() - t0;
    if (need > e->arena_cap[a]) {
        size_t size = (need + need / 4 + ARENA_STEP - 1) / ARENA_STEP * ARENA_STEP;
        if (e->arena[a] != 0)
            cu.MemFree(e->arena[a]);
        e->arena[a] = 0;
        e->arena_cap[a] = 0;
        if (!cuok(e, cu.MemAlloc(&e->arena[a], size), "cuMemAlloc (decode arena)")) {
            e->arena[a] = 0;
            return -1;
        }
        e->arena_cap[a] = size;
        e->st_arena_allocs++;
    }
    return a;
}

/* Decodes the batch's GPU samples (their regions: decode_gpu.clip_regions) into a device arena; refused ones
 * fall back. Host pixels are uploaded instead, in one copy of the host buffer that holds them: a PIXELS batch's
 * read arena, where each sample's pixels lie dense at its offset, or a batch's image arena of the PNGs the read team
 * decoded (decode_host), at the device arena's start (bytes of samples that failed or fell back ride along: one
 * copy costs less than a copy per sample); the kernel then reads each sample's pixels where they landed, whole.
 * Fills g_pos/g_reg/g_org/g_dec/g_aoff for the kernel and g_nv for the decoders. Returns the count of the GPU list,
 * or -1. */
static int64_t decode_batch(Engine *e, Job *j) {
    int64_t m = 0, mg = 0;
    int pixels = e->format == FMT_PIXELS;
    const unsigned char *up = pixels ? j->host : j->phost;
    size_t upload = pixels ? 0 : j->ptotal, need = (upload + ALIGN - 1) / ALIGN * ALIGN;
    for (int64_t k = 0; k < j->n; ++k) {
        if (j->state[k] != ST_OK)
            continue;
        const int64_t *row = j->hdr + ING_JPEG_COLUMNS * k, *r = j->plan[k].region;
        int64_t h = row[1], w = row[2];
        int64_t x0 = r[0] > 0 ? r[0] : 0, y0 = r[1] > 0 ? r[1] : 0, x1 = r[2] < w ? r[2] : w, y1 = r[3] < h ? r[3] : h;
        int whole = x0 == 0 && y0 == 0 && x1 == w && y1 == h, host = pixels || j->on_host[k];
        int keep = !host && e->regions && x1 > x0 && y1 > y0 && !whole && r[2] > r[0];
        int64_t *g = e->g_reg + 4 * m;
        if (keep) {
            g[0] = x0, g[1] = y0, g[2] = x1, g[3] = y1;
            e->g_org[2 * m] = x0, e->g_org[2 * m + 1] = y0;
            e->g_dec[2 * m] = y1 - y0, e->g_dec[2 * m + 1] = x1 - x0;
        } else {
            g[0] = g[1] = g[2] = g[3] = 0;
            e->g_org[2 * m] = e->g_org[2 * m + 1] = 0;
            e->g_dec[2 * m] = h, e->g_dec[2 * m + 1] = w;
        }
        e->g_pos[m] = k;
        size_t bytes = (size_t)(e->g_dec[2 * m] * e->g_dec[2 * m + 1] * 3);
        if (pixels) { /* where the read arena holds it */
            e->g_aoff[m] = j->img[2 * k];
            upload = (size_t)j->img[2 * k] + bytes > upload ? (size_t)j->img[2 * k] + bytes : upload;
            need = upload;
        } else if (host) { /* where the image arena holds it */
            e->g_aoff[m] = j->pix[k];
        } else {
            e->g_aoff[m] = (int64_t)need;
            need += (bytes + ALIGN - 1) / ALIGN * ALIGN;
            e->g_nv[mg++] = m;
        }
        ++m;
    }
    if (m == 0)
        return 0;
    int a = take_arena(e, j, need);
    if (a < 0)
        return -1;
    if (upload > 0 &&
        !cuok(e, cu.MemcpyHtoDAsync(e->arena[a], up, upload, e->stream), "cuMemcpyHtoDAsync (host pixels)"))
        return -1;
    /* np.array_split's shares of nvImageCodec's list: the first mg % ndec decoders take one more (PIXELS: no
     * decoders) */
    int64_t first = 0;
    for (int d = 0; d < e->ndec; ++d) {
        Decoder *dc = &e->dec[d];
        dc->first = first;
        dc->count = mg / e->ndec + (d < mg % e->ndec);
        for (int64_t i = 0; i < dc->count; ++i) {
            int64_t g = e->g_nv[first + i], k = e->g_pos[g];
            char *info = dc->slots.infos + i * e->lay.info_stride;
            uint32_t h = (uint32_t)e->g_dec[2 * g], w = (uint32_t)e->g_dec[2 * g + 1];
            size_t row = (size_t)w * 3;
            put_ptr(info, e->lay.off_buffer, (void *)(uintptr_t)(e->arena[a] + (CUdeviceptr)e->g_aoff[g]));
            put_ptr(info, e->lay.off_stream, e->stream);
            memcpy(info + e->lay.off_h, &h, sizeof h);
            memcpy(info + e->lay.off_w, &w, sizeof w);
            memcpy(info + e->lay.off_row, &row, sizeof row);
            dc->ptrs[i] = j->host + j->img[2 * k];
            dc->lens[i] = (size_t)j->img[2 * k + 1];
            for (int c = 0; c < 4; ++c)
                dc->regions[4 * i + c] = (int32_t)e->g_reg[4 * g + c];
        }
        first += dc->count;
    }
    if (mg > 0)
        team_run(&e->decoders, decode_fn);
    for (int d = 0; d < e->ndec; ++d) {
        Decoder *dc = &e->dec[d];
        for (int64_t i = 0; i < dc->count; ++i) {
            int64_t k = e->g_pos[e->g_nv[dc->first + i]];
            if (dc->out[i] != ING_NV_SUCCESS) {
                j->state[k] = ST_FALLBACK;
                j->why[k] = WHY_DECODER;
                j->status[k] = dc->out[i];
            }
        }
    }
    if (!cuok(e, cu.EventRecord(j->done, e->stream), "cuEventRecord"))
        return -1;
    j->recorded = 1;
    return m;
}

/* The masks of the m2 rows the image kernel was packed for (p_plan, p_pos, p_row), uploaded from the mask arena and
 * warped into the slot's mask output (uint8 [batch, out_h, out_w]) with their images' plans at the probed size:
 * the same matrices, boxes and windows (the image's narrowing to what every op reads is where Warp.for_masks puts
 * its box, `valid`: outside it the mask reads its fill), nearest sampling, one channel, no Normalize, the mask's
 * fill. The job's event is recorded again behind them: its host arenas are free once they ran. */
static int warp_masks(Engine *e, Job *j, int slot, int64_t m2) {
    CUdeviceptr out = e->slot_mask[slot];
    if (j->mtotal == 0 || out == 0)
        return 1;
    if (j->mtotal > j->mdev_cap) { /* (its last reader ran: take_job waited for the job's event) */
        if (j->mdev != 0)
            cu.MemFree(j->mdev);
        j->mdev = 0;
        j->mdev_cap = 0;
        size_t size = (j->mtotal + j->mtotal / 4 + ARENA_STEP - 1) / ARENA_STEP * ARENA_STEP;
        if (!cuok(e, cu.MemAlloc(&j->mdev, size), "cuMemAlloc (mask arena)")) {
            j->mdev = 0;
            return 0;
        }
        j->mdev_cap = size;
        e->st_arena_allocs++;
    }
    size_t args = (size_t)(32 * e->batch + 16) * sizeof(int64_t);
    int64_t *ip = (int64_t *)(e->slot_host[slot] + (size_t)e->batch * sizeof(int64_t) + args);
    double *fp = (double *)(ip + 16 * m2);
    for (int64_t q = 0; q < m2; ++q) {
        int64_t k = e->p_pos[q];
        e->p_hw[2 * q] = j->hw[2 * k];
        e->p_hw[2 * q + 1] = j->hw[2 * k + 1];
        e->p_src[q] = (uint64_t)(j->mdev + (CUdeviceptr)j->mask[2 * k]);
    }
    int32_t grid[3];
    ing_plan_out plan = {.sample = e->p_plan, .params = NULL, .interpolation = ING_NEAREST, .antialias = 0};
    int st = ing_pack(&e->mchain, m2, &plan, NULL, e->p_hw, e->p_src, NULL, ip, fp, grid);
    if (st != ING_OK) {
        fail(e, "the native planner could not pack the masks of batch %lld of epoch %lld: %s", (long long)j->number,
             (long long)j->epoch, ing_strerror(st));
        return 0;
    }
    for (int64_t q = 0; q < m2; ++q)
        ip[16 * q + 1] = e->p_row[q] * e->out_h * e->out_w;
    size_t bytes = (size_t)(16 * m2 + 16 * (m2 + 1)) * sizeof(int64_t);
    CUdeviceptr d_ip = e->slot_args[slot] + (CUdeviceptr)args, d_fp = d_ip + (CUdeviceptr)(16 * m2 * sizeof(int64_t));
    int channels = 1, kind = 0, nchw = 0, normalize = 0;
    void *params[] = {&d_ip, &d_fp, &out, &channels, &kind, &nchw, &normalize};
    return cuok(e, cu.MemcpyHtoDAsync(j->mdev, j->mhost, j->mtotal, e->stream), "cuMemcpyHtoDAsync (masks)") &&
           cuok(e, cu.MemcpyHtoDAsync(d_ip, ip, bytes, e->stream), "cuMemcpyHtoDAsync (mask arguments)") &&
           cuok(e, cu.LaunchKernel(e->kernels[ING_NEAREST], (unsigned)grid[0], (unsigned)grid[1], (unsigned)grid[2],
                                   32, 8, 1, 0, e->stream, params, NULL), "cuLaunchKernel (mask warp)") &&
           cuok(e, cu.EventRecord(j->done, e->stream), "cuEventRecord");
}

/* Takes a slot and writes the batch into it: rows, labels, indices, padding, notes, and (GPU) the kernel. */
static int output_batch(Engine *e, Job *j, int64_t m) {
    const Note *notes = j->notes;
    int64_t nnotes = j->nnotes;
    int64_t t0 = mono_ns();
    int slot = take_slot(e);
    if (slot < 0)
        return 0;
    pthread_mutex_lock(&e->lock); /* set_slot may have replaced them while the slot was out */
    CUdeviceptr out = e->slot_out[slot], labels_dev = e->slot_lbl[slot];
    int64_t *idx = e->slot_held[3 * slot] ? e->slot_idx[slot].buf : NULL;
    uint8_t *pad = e->slot_held[3 * slot + 1] ? e->slot_pad[slot].buf : NULL;
    int64_t *dry = e->slot_held[3 * slot + 2] ? e->slot_dry[slot].buf : NULL;
    pthread_mutex_unlock(&e->lock);
    if (e->gpu && !cuok(e, cu.EventSynchronize(e->slot_ready[slot]), "cuEventSynchronize"))
        return 0; /* the slot's pinned memory is written below: its last uploads must have run */
    j->t[T_SLOT] = mono_ns() - t0;
    int64_t *labels = (int64_t *)e->slot_host[slot];
    int64_t rows = 0;
    Note *kept = e->slot_notes[slot];
    int64_t nkept = 0;
    for (int64_t q = 0; q < nnotes; ++q)
        if (notes[q].stage == NOTE_READ || notes[q].stage == NOTE_CORRUPT)
            kept[nkept++] = notes[q];
    for (int64_t k = 0; k < j->n; ++k) {
        if (j->state[k] == ST_FAILED) {
            e->g_row[k] = -1;
            continue;
        }
        e->g_row[k] = rows;
        labels[rows] = j->label[k];
        if (idx)
            idx[rows] = j->index[k];
        if (pad)
            pad[rows] = j->pad[k];
        if (j->state[k] == ST_FALLBACK)
            kept[nkept++] = (Note){j->index[k], rows, NOTE_FALLBACK, j->why[k], j->status[k]};
        else if (j->on_host[k]) /* (OK: its image decoded on the host) */
            kept[nkept++] = (Note){j->index[k], rows, NOTE_HOST, 0, 0};
        if (dry) {
            int64_t *d = dry + D_COLS * rows;
            memset(d, 0, D_COLS * sizeof(int64_t));
            d[D_INDEX] = j->index[k];
            d[D_LABEL] = j->label[k];
            d[D_STATUS] = j->state[k] == ST_OK ? 0 : 1;
            d[D_PAD] = j->pad[k];
            if (j->state[k] == ST_OK || j->why[k] == WHY_PLAN) {
                const ing_sample *s = &j->plan[k];
                const int64_t *row = j->hdr + ING_JPEG_COLUMNS * k, *r = s->region;
                int64_t h = row[1], w = row[2];
                int64_t x0 = r[0] > 0 ? r[0] : 0, y0 = r[1] > 0 ? r[1] : 0, x1 = r[2] < w ? r[2] : w,
                        y1 = r[3] < h ? r[3] : h;
                int whole = x0 == 0 && y0 == 0 && x1 == w && y1 == h;
                d[D_H] = h, d[D_W] = w;
                memcpy(d + D_RX0, r, 4 * sizeof(int64_t));
                if (e->format != FMT_PIXELS && !j->on_host[k] && e->regions && x1 > x0 && y1 > y0 && !whole &&
                    r[2] > r[0])
                    d[D_DX0] = x0, d[D_DY0] = y0, d[D_DX1] = x1, d[D_DY1] = y1;
                d[D_OH] = s->out_hw[0], d[D_OW] = s->out_hw[1];
            }
        }
        ++rows;
    }
    e->slot_nnotes[slot] = nkept;
    if (!det_rows(e, j, slot, rows))
        return 0;
    if (e->gpu) { /* the kernel writes the slot after the work the consumer queued before giving it back */
        unsigned long long consumer = e->slot_stream[slot];
        e->slot_stream[slot] = NO_STREAM;
        if (consumer != NO_STREAM &&
            (!cuok(e, cu.EventRecord(e->slot_free[slot], (CUstream)(uintptr_t)consumer), "cuEventRecord") ||
             !cuok(e, cu.StreamWaitEvent(e->stream, e->slot_free[slot], 0), "cuStreamWaitEvent")))
            return 0;
        /* the GPU list's samples that decoded, packed in the order of their rows */
        int64_t m2 = 0;
        for (int64_t g = 0; g < m; ++g) {
            int64_t k = e->g_pos[g];
            if (j->state[k] != ST_OK)
                continue;
            e->p_plan[m2] = j->plan[k];
            e->p_org[2 * m2] = e->g_org[2 * g], e->p_org[2 * m2 + 1] = e->g_org[2 * g + 1];
            e->p_dec[2 * m2] = e->g_dec[2 * g], e->p_dec[2 * m2 + 1] = e->g_dec[2 * g + 1];
            e->p_src[m2] = (uint64_t)(e->arena[j->arena] + (CUdeviceptr)e->g_aoff[g]);
            e->p_row[m2] = e->g_row[k];
            e->p_pos[m2] = k;
            ++m2;
        }
        if (m2 > 0) {
            int64_t *ip = (int64_t *)(e->slot_host[slot] + (size_t)e->batch * sizeof(int64_t));
            double *fp = (double *)(ip + 16 * m2);
            int32_t grid[3];
            ing_plan_out plan = {.sample = e->p_plan, .params = NULL, .interpolation = j->interpolation,
                                 .antialias = j->antialias};
            /* (pixels: whole images at their planned size, as the Python stages' warp takes them: no origins) */
            int st = ing_pack(&e->chain, m2, &plan, e->format == FMT_PIXELS ? NULL : e->p_org, e->p_dec, e->p_src,
                              NULL, ip, fp, grid);
            if (st != ING_OK) {
                fail(e, "the native planner could not pack batch %lld of epoch %lld: %s", (long long)j->number,
                     (long long)j->epoch, ing_strerror(st));
                return 0;
            }
            for (int64_t q = 0; q < m2; ++q)
                ip[16 * q + 1] = e->p_row[q] * (e->det.on ? j->det.row_elems : e->row_elems);
            size_t bytes = (size_t)(16 * m2 + 16 * (m2 + 1)) * sizeof(int64_t);
            CUdeviceptr d_ip = e->slot_args[slot], d_fp = d_ip + (CUdeviceptr)(16 * m2 * sizeof(int64_t)), d_out = out;
            int channels = e->chain.channels, kind = e->chain.kind, nchw = e->chain.nchw;
            int normalize = e->chain.normalize;
            void *params[] = {&d_ip, &d_fp, &d_out, &channels, &kind, &nchw, &normalize};
            int which = j->interpolation >= 0 && j->interpolation < 3 ? j->interpolation : 0;
            if (!cuok(e, cu.MemcpyHtoDAsync(d_ip, ip, bytes, e->stream), "cuMemcpyHtoDAsync (kernel arguments)") ||
                !cuok(e, cu.LaunchKernel(e->kernels[which], (unsigned)grid[0], (unsigned)grid[1], (unsigned)grid[2],
                                         32, 8, 1, 0, e->stream, params, NULL), "cuLaunchKernel (warp)"))
                return 0;
            if (e->masks && !warp_masks(e, j, slot, m2))
                return 0;
        }
        if (m > 0) { /* the arena is free once the kernel ran (or at once when nothing of it was kept) */
            if (!cuok(e, cu.EventRecord(e->arena_ev[j->arena], e->stream), "cuEventRecord"))
                return 0;
            e->arena_used[j->arena] = 1;
        }
        if (rows > 0 && !cuok(e, cu.MemcpyHtoDAsync(labels_dev, labels, (size_t)rows * sizeof(int64_t), e->stream),
                              "cuMemcpyHtoDAsync (labels)"))
            return 0;
        if (!det_upload(e, slot))
            return 0;
        if (!cuok(e, cu.EventRecord(e->slot_ready[slot], e->stream), "cuEventRecord"))
            return 0;
    }
    j->t[T_OUTPUT] = mono_ns() - t0 - j->t[T_SLOT];
    pthread_mutex_lock(&e->lock);
    e->st_batches++;
    e->st_samples += rows;
    for (int s = 0; s < T_COUNT; ++s) /* the batch's stage times */
        e->t_sum[s] += j->t[s];
    if (e->st_batches <= T_FIRST)
        memcpy(e->t_first[e->st_batches - 1], j->t, sizeof j->t);
    for (int64_t q = 0; q < nkept; ++q) {
        e->st_fallbacks += kept[q].stage == NOTE_FALLBACK;
        e->st_failures += kept[q].stage == NOTE_READ || kept[q].stage == NOTE_CORRUPT;
    }
    for (int64_t k = 0; k < j->n; ++k)
        e->st_bytes += j->got[k] > 0 ? j->got[k] : 0;
    pthread_mutex_unlock(&e->lock);
    return post(e, (Ready){R_BATCH, slot, j->epoch, j->number, rows});
}

static void *decoder_main(void *arg) {
    Engine *e = arg;
    engine_thread_start(e, "ingest-decoder");
    if (e->gpu && !cuok(e, cu.CtxSetCurrent(e->ctx), "cuCtxSetCurrent"))
        return NULL;
    for (;;) {
        int64_t t0 = mono_ns();
        pthread_mutex_lock(&e->lock);
        while (e->dq_len == 0 && !e->stop)
            pthread_cond_wait(&e->cond, &e->lock);
        if (e->stop) {
            pthread_mutex_unlock(&e->lock);
            break;
        }
        Job *j = e->dq[e->dq_head].job;
        int64_t epoch = e->dq[e->dq_head].epoch;
        e->dq_head = (e->dq_head + 1) % QCAP;
        e->dq_len--;
        pthread_cond_broadcast(&e->cond);
        pthread_mutex_unlock(&e->lock);
        if (j == NULL) {
            if (!post(e, (Ready){R_EPOCH, -1, epoch, 0, 0}))
                break;
            continue;
        }
        int64_t m = 0;
        int ok = 1;
        int64_t t1 = mono_ns();
        j->t[T_IDLE] = t1 - t0;
        if (e->gpu)
            ok = (m = decode_batch(e, j)) >= 0;
        j->t[T_DECODE] = mono_ns() - t1 - j->t[T_ARENA];
        ok = ok && output_batch(e, j, m);
        give_job(e, j);
        if (!ok)
            break;
    }
    return NULL;
}

/* -- construction and teardown ----------------------------------------------------------------------------- */

static void engine_join(Engine *e) {
    pthread_mutex_lock(&e->lock);
    e->stop = 1;
    pthread_cond_broadcast(&e->cond);
    pthread_mutex_unlock(&e->lock);
    if (e->reader_started)
        pthread_join(e->reader, NULL);
    if (e->decoder_started)
        pthread_join(e->decoder, NULL);
    e->reader_started = e->decoder_started = 0;
    if (e->teams_made) {
        team_stop(&e->readers);
        team_stop(&e->decoders);
        e->teams_made = 0;
    }
}

/* Frees everything native (called once the threads are joined; GPU memory after the stream has run). */
static void engine_free(Engine *e) {
    if (e->gpu && e->ctx != NULL) {
        cu.CtxPush(e->ctx);
        if (e->stream != NULL)
            cu.StreamSynchronize(e->stream);
        for (int a = 0; a < ARENAS; ++a) {
            if (e->arena[a])
                cu.MemFree(e->arena[a]);
            if (e->arena_ev[a])
                cu.EventDestroy(e->arena_ev[a]);
        }
        for (int64_t s = 0; s < e->nslots; ++s) {
            if (e->slot_args && e->slot_args[s])
                cu.MemFree(e->slot_args[s]);
            if (e->slot_host && e->slot_host[s])
                cu.MemFreeHost(e->slot_host[s]);
            if (e->slot_ready && e->slot_ready[s])
                cu.EventDestroy(e->slot_ready[s]);
            if (e->slot_free && e->slot_free[s])
                cu.EventDestroy(e->slot_free[s]);
        }
        for (int k = 0; k < JOBS; ++k) {
            if (e->jobs[k].host)
                cu.MemFreeHost(e->jobs[k].host);
            if (e->jobs[k].mhost)
                cu.MemFreeHost(e->jobs[k].mhost);
            if (e->jobs[k].phost)
                cu.MemFreeHost(e->jobs[k].phost);
            e->jobs[k].phost = NULL;
            if (e->jobs[k].mdev)
                cu.MemFree(e->jobs[k].mdev);
            e->jobs[k].mhost = NULL;
            e->jobs[k].mdev = 0;
            if (e->jobs[k].done)
                cu.EventDestroy(e->jobs[k].done);
            e->jobs[k].host = NULL;
        }
        for (int d = 0; e->dec && d < e->ndec; ++d)
            decoder_destroy(e, &e->dec[d], e->image_destroy, e->stream_destroy);
        decoder_destroy(e, &e->hdec, e->h_image_destroy, e->h_stream_destroy);
        if (e->stream != NULL)
            cu.StreamDestroy(e->stream);
        CUcontext popped;
        cu.CtxPop(&popped);
        cu.PrimaryRelease(e->dev);
        e->ctx = NULL;
    } else if (e->slot_host) {
        for (int64_t s = 0; s < e->nslots; ++s)
            free(e->slot_host[s]);
    }
    for (int k = 0; k < JOBS; ++k) {
        Job *j = &e->jobs[k];
        if (!e->gpu) {
            free(j->host);
            free(j->mhost);
            free(j->phost);
        }
        free(j->png); /* (and ipng) */
        j->png = j->ipng = NULL;
        free(j->index); /* one block holds every per-sample array of the job */
        free(j->plan);  /* and one its plans */
        free(j->notes);
        j->index = NULL;
        j->plan = NULL;
        j->notes = NULL;
    }
    for (int d = 0; e->dec && d < e->ndec; ++d) {
        Decoder *dc = &e->dec[d];
        free(dc->slots.parents);
        free(dc->slots.infos);
    }
    free(e->dec);
    e->dec = NULL;
    free(e->hdec.slots.parents);
    free(e->hdec.slots.infos);
    memset(&e->hdec, 0, sizeof e->hdec);
    free(e->hpos);
    e->hpos = NULL;
    for (int t = 0; e->png_workers && t < e->readers.size; ++t)
        ing_png_worker_free(&e->png_workers[t]);
    free(e->png_workers);
    e->png_workers = NULL;
    if (e->fds) {
        for (int64_t f = 0; f < e->nfiles; ++f)
            if (e->fds[f] >= 0)
                close(e->fds[f]);
        free(e->fds);
        e->fds = NULL;
    }
    while (e->epochs) {
        Epoch *ep = e->epochs;
        e->epochs = ep->next;
        free(ep->indices);
        free(ep->bounds);
        free(ep->pad);
        free(ep);
    }
    for (int64_t s = 0; e->slot_notes && s < e->nslots; ++s)
        free(e->slot_notes[s]);
    free(e->slot_notes);
    free(e->slot_host);
    free(e->slot_out);
    free(e->slot_lbl);
    free(e->slot_args);
    free(e->slot_mask);
    free(e->slot_ready);
    free(e->slot_free);
    free(e->slot_stream);
    free(e->posted);
    free(e->slot_nnotes);
    free(e->free_slots);
    free(e->slot_given);
    free(e->pending);
    free(e->g_pos);
    free(e->p_src);
    free(e->p_plan);
    free(e->paths);
    free(e->path_block);
    free(e->files);
    free(e->crcs);
    free(e->python);
    free(e->pixel_hw);
    e->pixel_hw = NULL;
    free(e->mask_off);
    free(e->mask_size);
    free(e->mask_crcs);
    e->mask_off = e->mask_size = NULL;
    e->mask_crcs = NULL;
    free(e->key_block);
    e->python = NULL;
    e->key_block = NULL;
    e->slot_notes = NULL;
    e->slot_host = NULL;
    e->slot_out = e->slot_lbl = e->slot_args = e->slot_mask = NULL;
    e->slot_ready = e->slot_free = NULL;
    e->slot_stream = NULL;
    e->posted = NULL;
    e->slot_nnotes = NULL;
    e->free_slots = NULL;
    e->slot_given = NULL;
    e->pending = NULL;
    det_free(e);
    e->g_pos = NULL;
    e->p_src = NULL;
    e->p_plan = NULL;
    e->paths = NULL;
    e->path_block = NULL;
    e->files = NULL;
    e->crcs = NULL;
}

/* Releases the Python buffers the slots hold (GIL held). */
static void release_buffers(Engine *e) {
    det_release(e);
    for (int64_t s = 0; e->slot_held && s < e->nslots; ++s) {
        if (e->slot_held[3 * s])
            PyBuffer_Release(&e->slot_idx[s]);
        if (e->slot_held[3 * s + 1])
            PyBuffer_Release(&e->slot_pad[s]);
        if (e->slot_held[3 * s + 2])
            PyBuffer_Release(&e->slot_dry[s]);
    }
    free(e->slot_held);
    free(e->slot_idx);
    free(e->slot_pad);
    free(e->slot_dry);
    e->slot_held = NULL;
    e->slot_idx = e->slot_pad = e->slot_dry = NULL;
}

/* A method's entry (GIL held): 0 with an exception set in a forked child or once closed. `closed` is set and
 * checked with the GIL held, and close() frees only after it gave the GIL up: a method that keeps the GIL
 * throughout cannot overlap the freeing. next(), which gives it up while it waits, is counted in `users`
 * (`enter_waiting` / `leave`), and close() frees nothing before the count is back at 0. */
static int alive(Engine *e) {
    if (e->pid != getpid()) {
        PyErr_SetString(PyExc_RuntimeError, "this native engine belongs to the parent process (forked)");
        return 0;
    }
    if (e->closed) {
        PyErr_SetString(PyExc_RuntimeError, "the native engine is closed");
        return 0;
    }
    return 1;
}

static int enter_waiting(Engine *e) {
    if (!alive(e))
        return 0;
    __atomic_add_fetch(&e->users, 1, __ATOMIC_ACQ_REL);
    return 1;
}

static void leave(Engine *e) {
    if (__atomic_sub_fetch(&e->users, 1, __ATOMIC_ACQ_REL) == 0 && e->closed) {
        pthread_mutex_lock(&e->lock); /* close() waits for the count */
        pthread_cond_broadcast(&e->cond);
        pthread_mutex_unlock(&e->lock);
    }
}

static void engine_close(Engine *e) {
    if (e->closed)
        return;
    e->closed = 1;
    Py_BEGIN_ALLOW_THREADS
    engine_join(e); /* (stop is set: a next() waiting returns) */
    pthread_mutex_lock(&e->lock);
    while (__atomic_load_n(&e->users, __ATOMIC_ACQUIRE) > 0) { /* (timed: a wake-up may come before the wait) */
        struct timespec at;
        clock_gettime(CLOCK_REALTIME, &at);
        at.tv_nsec += 10 * 1000 * 1000;
        if (at.tv_nsec >= 1000000000L) {
            at.tv_sec++;
            at.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&e->cond, &e->lock, &at);
    }
    pthread_mutex_unlock(&e->lock);
    engine_free(e);
    Py_END_ALLOW_THREADS
    release_buffers(e);
    pthread_cond_destroy(&e->cond);
    pthread_mutex_destroy(&e->lock);
}

static void Engine_dealloc(Engine *e) {
    if (e->pid == getpid())
        engine_close(e); /* a forked child's copy is dropped as it is: its threads and locks are the parent's */
    Py_TYPE(e)->tp_free((PyObject *)e);
}

/* An int64 buffer of `count` items (count < 0: any), copied into new memory; NULL with an exception set. */
static int64_t *copy_int64s(PyObject *obj, int64_t count, int64_t *got, const char *name) {
    Py_buffer v;
    if (PyObject_GetBuffer(obj, &v, PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    int64_t *out = NULL;
    if (v.len % 8 || (count >= 0 && v.len != count * 8)) {
        PyErr_Format(PyExc_ValueError, "%s: expected %lld int64 values, got %zd bytes", name, (long long)count, v.len);
    } else if ((out = malloc(v.len ? (size_t)v.len : 8)) == NULL) {
        PyErr_NoMemory();
    } else {
        memcpy(out, v.buf, (size_t)v.len);
        if (got)
            *got = v.len / 8;
    }
    PyBuffer_Release(&v);
    return out;
}

/* A copy of `n` uint32 CRC32Cs (a buffer of exactly that many); NULL with an exception set. */
static uint32_t *copy_crcs(PyObject *obj, int64_t n, const char *name) {
    Py_buffer v;
    if (PyObject_GetBuffer(obj, &v, PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    uint32_t *out = NULL;
    if (v.len != n * 4)
        PyErr_Format(PyExc_ValueError, "%s holds %zd bytes, %lld uint32 CRCs need %lld", name, v.len, (long long)n,
                     (long long)n * 4);
    else if ((out = malloc((size_t)(n ? n : 1) * 4)) == NULL)
        PyErr_NoMemory();
    else
        memcpy(out, v.buf, (size_t)n * 4);
    PyBuffer_Release(&v);
    return out;
}

static int alloc_job(Engine *e, Job *j) {
    int64_t B = e->batch;
    /* one block: 13 int64 arrays of B, hdr (9 B), hw, ok_hw, img (2 B each), then state, why, status, pad,
     * on_host */
    size_t ints = (size_t)B * (13 + 9 + 6), bytes = ints * 8 + (size_t)B * (4 + 4 + 4 + 1 + 1);
    char *block = calloc(1, bytes + 16);
    ing_sample *plans = calloc((size_t)(2 * B), sizeof(ing_sample));
    Note *notes = calloc((size_t)B, sizeof(Note));
    ing_png *png = calloc((size_t)(2 * B), sizeof(ing_png)); /* masks, then images */
    if (block == NULL || plans == NULL || notes == NULL || png == NULL) {
        free(block);
        free(plans);
        free(notes);
        free(png);
        return -1;
    }
    j->png = png;
    j->ipng = png + B;
    j->notes = notes;
    int64_t *p = (int64_t *)block;
    j->index = p, p += B;
    j->label = p, p += B;
    j->off = p, p += B;
    j->want = p, p += B;
    j->got = p, p += B;
    j->ok_pos = p, p += B;
    j->ok_index = p, p += B;
    j->crc = p, p += B;
    j->mask = p, p += 2 * B;
    j->mcrc = p, p += B;
    j->pix = p, p += B;
    j->stored = p, p += B;
    j->hdr = p, p += 9 * B;
    j->hw = p, p += 2 * B;
    j->ok_hw = p, p += 2 * B;
    j->img = p, p += 2 * B;
    j->state = (int32_t *)p;
    j->why = j->state + B;
    j->status = (uint32_t *)(j->why + B);
    j->pad = (uint8_t *)(j->status + B);
    j->on_host = j->pad + B;
    j->plan = plans;
    j->ok_plan = plans + B;
    return 0;
}


/* The device's primary context (torch's), a stream of the engine's own, events, argument buffers; 0 on success,
 * -1 with an exception set. */
static int setup_cuda(Engine *e, int device) {
    int64_t B = e->batch;
    if (!cuok(e, cu.Init(0), "cuInit") || !cuok(e, cu.DeviceGet(&e->dev, device), "cuDeviceGet") ||
        !cuok(e, cu.PrimaryRetain(&e->ctx, e->dev), "cuDevicePrimaryCtxRetain")) {
        PyErr_SetString(PyExc_RuntimeError, e->error);
        return -1;
    }
    e->gpu = 1;
    cu.CtxPush(e->ctx);
    int ok = cuok(e, cu.StreamCreate(&e->stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    for (int a = 0; ok && a < ARENAS; ++a)
        ok = cuok(e, cu.EventCreate(&e->arena_ev[a], CU_EVENT_DISABLE_TIMING), "cuEventCreate");
    for (int k = 0; ok && k < JOBS; ++k)
        ok = cuok(e, cu.EventCreate(&e->jobs[k].done, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
    /* pinned per slot: labels, the image kernel's arguments, the mask kernel's */
    size_t host_bytes = (size_t)B * 8 + 2 * (size_t)(32 * B + 16) * 8;
    for (int64_t s = 0; ok && s < e->nslots; ++s) {
        ok = cuok(e, cu.EventCreate(&e->slot_ready[s], CU_EVENT_DISABLE_TIMING), "cuEventCreate") &&
             cuok(e, cu.EventCreate(&e->slot_free[s], CU_EVENT_DISABLE_TIMING), "cuEventCreate") &&
             cuok(e, cu.MemAlloc(&e->slot_args[s], 2 * (size_t)(32 * B + 16) * 8), "cuMemAlloc (kernel arguments)") &&
             cuok(e, cu.MemHostAlloc((void **)&e->slot_host[s], host_bytes, 0), "cuMemHostAlloc");
    }
    CUcontext popped;
    cu.CtxPop(&popped);
    if (!ok) {
        PyErr_SetString(PyExc_RuntimeError, e->error);
        return -1;
    }
    return 0;
}

/* A PIXELS table's `gpu` tuple: (device, the 3 kernels). Nothing is decoded, so no nvImageCodec. */
static int setup_pixels_gpu(Engine *e, PyObject *gpu) {
    int device;
    PyObject *kernels;
    if (!PyArg_ParseTuple(gpu, "iO:gpu", &device, &kernels))
        return -1;
    if (!PyTuple_Check(kernels) || PyTuple_GET_SIZE(kernels) != 3) {
        PyErr_SetString(PyExc_TypeError, "gpu: expected (device, 3 kernels) for a pixels table");
        return -1;
    }
    for (int k = 0; k < 3; ++k)
        if ((e->kernels[k] = PyLong_AsVoidPtr(PyTuple_GET_ITEM(kernels, k))) == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "gpu: a null address");
            return -1;
        }
    const char *why = load_cuda();
    if (why != NULL) {
        PyErr_SetString(PyExc_ImportError, why);
        return -1;
    }
    return setup_cuda(e, device);
}

/* A decoder's handle slots and scratch for batches of up to e->batch images, its structs copied from the templates
 * (of layout L); -1 where memory runs out. */
static int decoder_init(Engine *e, Decoder *dc, const NvLayout *L, const void *info, const void *view,
                        const void *probe) {
    int64_t B = e->batch;
    /* handles and scratch in one block: parents, subs, images, streams, images picked (void *), ptrs,
     * picked, lens, then statuses, out (uint32) and regions (int32 x 4) */
    size_t words = (size_t)B * 8;
    char *block = calloc(1, words * 8 + (size_t)B * (4 + 4 + 16));
    char *structs = calloc(1, (size_t)B * (size_t)(L->info_stride + L->view_stride) + (size_t)L->probe_size);
    if (block == NULL || structs == NULL) {
        free(block);
        free(structs);
        return -1;
    }
    void **w = (void **)block;
    dc->slots.parents = w, w += B;
    dc->slots.subs = w, w += B;
    dc->slots.images = w, w += B;
    dc->streams = w, w += B;
    dc->images = w, w += B;
    dc->ptrs = (const unsigned char **)w, w += B;
    dc->picked = (ptrdiff_t *)w, w += B;
    dc->lens = (size_t *)w, w += B;
    dc->statuses = (uint32_t *)w;
    dc->out = dc->statuses + B;
    dc->regions = (int32_t *)(dc->out + B);
    dc->slots.infos = structs;
    dc->slots.views = structs + B * L->info_stride;
    dc->slots.probe = dc->slots.views + B * L->view_stride;
    dc->slots.info_stride = L->info_stride;
    dc->slots.view_stride = L->view_stride;
    dc->slots.start_off = L->off_start;
    dc->slots.end_off = L->off_end;
    dc->slots.codec_off = L->off_codec;
    for (int64_t i = 0; i < B; ++i) {
        memcpy(dc->slots.infos + i * L->info_stride, info, (size_t)L->info_stride);
        memcpy(dc->slots.views + i * L->view_stride, view, (size_t)L->view_stride);
    }
    memcpy(dc->slots.probe, probe, (size_t)L->probe_size);
    return 0;
}

/* nvImageCodec's ING_NV_COUNT loop functions and its image and code stream destroy functions from their addresses
 * (`fns`, `destroys`: tuples); -1 with an exception set. */
static int nv_functions(PyObject *fns, PyObject *destroys, ing_nv_functions *f, int (**image_destroy)(void *),
                        int (**stream_destroy)(void *)) {
    void *fp[ING_NV_COUNT];
    if (!PyTuple_Check(fns) || PyTuple_GET_SIZE(fns) != ING_NV_COUNT || !PyTuple_Check(destroys) ||
        PyTuple_GET_SIZE(destroys) != 2) {
        PyErr_SetString(PyExc_TypeError, "gpu: expected 8 nvImageCodec functions and 2 destroy functions");
        return -1;
    }
    for (int k = 0; k < ING_NV_COUNT; ++k)
        if ((fp[k] = PyLong_AsVoidPtr(PyTuple_GET_ITEM(fns, k))) == NULL)
            goto bad_address;
    ing_nv_functions_from(f, fp);
    if ((*(void **)image_destroy = PyLong_AsVoidPtr(PyTuple_GET_ITEM(destroys, 0))) == NULL ||
        (*(void **)stream_destroy = PyLong_AsVoidPtr(PyTuple_GET_ITEM(destroys, 1))) == NULL)
        goto bad_address;
    return 0;
bad_address:
    if (!PyErr_Occurred())
        PyErr_SetString(PyExc_ValueError, "gpu: a null address");
    return -1;
}

/* Whether layout L's field offsets lie inside its structs (ValueError naming `what` where not). */
static int layout_ok(const NvLayout *L, const char *what) {
    if (L->off_buffer + 8 > L->info_stride || L->off_stream + 8 > L->info_stride || L->off_h + 4 > L->info_stride ||
        L->off_w + 4 > L->info_stride || L->off_row + 8 > L->info_stride || L->off_start + 8 > L->view_stride ||
        L->off_end + 8 > L->view_stride || L->off_codec >= L->probe_size || L->off_buffer < 0 || L->off_stream < 0 ||
        L->off_h < 0 || L->off_w < 0 || L->off_row < 0 || L->off_start < 0 || L->off_end < 0 || L->off_codec < 0) {
        PyErr_Format(PyExc_ValueError, "%s: a struct field offset lies outside its struct", what);
        return 0;
    }
    return 1;
}

/* The `cpu` item of the `gpu` tuple: (functions, destroy functions, instance, decoder, decode params, (image info
 * template, offsets), (code stream view template, offsets), (code stream info template, offset)) of an
 * nvImageCodec decoder of host output, in the GPU part's form but its own (its library may be another's: the tests'
 * GPU is a stand-in); 0 on success, -1 with an exception set. */
static int setup_host_decoder(Engine *e, PyObject *cpu) {
    PyObject *fns, *destroys;
    unsigned long long instance, decoder, params;
    Py_buffer info, view, probe;
    NvLayout *L = &e->hlay;
    if (!PyArg_ParseTuple(cpu, "OOKKK(y*nnnnn)(y*nn)(y*n):cpu", &fns, &destroys, &instance, &decoder, &params, &info,
                          &L->off_buffer, &L->off_stream, &L->off_h, &L->off_w, &L->off_row, &view, &L->off_start,
                          &L->off_end, &probe, &L->off_codec))
        return -1;
    int result = -1;
    L->info_stride = info.len;
    L->view_stride = view.len;
    L->probe_size = probe.len;
    if (!layout_ok(L, "cpu") || nv_functions(fns, destroys, &e->hnv, &e->h_image_destroy, &e->h_stream_destroy) < 0)
        goto done;
    if (instance == 0 || decoder == 0 || params == 0) {
        PyErr_SetString(PyExc_ValueError, "cpu: a null handle");
        goto done;
    }
    e->hinstance = (void *)(uintptr_t)instance;
    e->hparams = (void *)(uintptr_t)params;
    if ((e->hpos = calloc((size_t)e->batch, sizeof(int64_t))) == NULL ||
        decoder_init(e, &e->hdec, L, info.buf, view.buf, probe.buf) < 0) {
        PyErr_NoMemory();
        goto done;
    }
    e->hdec.handle = (void *)(uintptr_t)decoder;
    result = 0;
done:
    PyBuffer_Release(&info);
    PyBuffer_Release(&view);
    PyBuffer_Release(&probe);
    return result;
}

/* The GPU part of the constructor (the `gpu` tuple); 0 on success, -1 with an exception set. */
static int setup_gpu(Engine *e, PyObject *gpu) {
    if (e->format == FMT_PIXELS)
        return setup_pixels_gpu(e, gpu);
    int device;
    PyObject *fns, *destroys, *decoders, *kernels, *cpu = Py_None;
    unsigned long long instance, params;
    Py_buffer info_t, view_t, probe_t;
    if (!PyArg_ParseTuple(gpu, "iOOKOK(y*nnnnn)(y*nn)(y*n)O|O:gpu", &device, &fns, &destroys, &instance, &decoders,
                          &params, &info_t, &e->lay.off_buffer, &e->lay.off_stream, &e->lay.off_h, &e->lay.off_w, &e->lay.off_row,
                          &view_t, &e->lay.off_start, &e->lay.off_end, &probe_t, &e->lay.off_codec, &kernels, &cpu))
        return -1;
    int result = -1;
    if (!PyTuple_Check(kernels) || PyTuple_GET_SIZE(kernels) != 3 || !PyTuple_Check(decoders) ||
        PyTuple_GET_SIZE(decoders) < 1) {
        PyErr_SetString(PyExc_TypeError, "gpu: expected 3 kernels and at least one decoder");
        goto done;
    }
    if (nv_functions(fns, destroys, &e->nv, &e->image_destroy, &e->stream_destroy) < 0)
        goto done;
    for (int k = 0; k < 3; ++k)
        if ((e->kernels[k] = PyLong_AsVoidPtr(PyTuple_GET_ITEM(kernels, k))) == NULL)
            goto bad_address;
    e->instance = (void *)(uintptr_t)instance;
    e->params = (void *)(uintptr_t)params;
    e->lay.info_stride = info_t.len;
    e->lay.view_stride = view_t.len;
    e->lay.probe_size = probe_t.len;
    if (!layout_ok(&e->lay, "gpu"))
        goto done;
    const char *why = load_cuda();
    if (why != NULL) {
        PyErr_SetString(PyExc_ImportError, why);
        goto done;
    }
    e->ndec = (int)PyTuple_GET_SIZE(decoders);
    if ((e->dec = calloc((size_t)e->ndec, sizeof(Decoder))) == NULL)
        goto nomem;
    for (int d = 0; d < e->ndec; ++d) {
        Decoder *dc = &e->dec[d];
        if ((dc->handle = PyLong_AsVoidPtr(PyTuple_GET_ITEM(decoders, d))) == NULL)
            goto bad_address;
        if (decoder_init(e, dc, &e->lay, info_t.buf, view_t.buf, probe_t.buf) < 0)
            goto nomem;
    }
    if (cpu != Py_None && setup_host_decoder(e, cpu) < 0)
        goto done;
    result = setup_cuda(e, device);
    goto done;
bad_address:
    if (!PyErr_Occurred())
        PyErr_SetString(PyExc_ValueError, "gpu: a null address");
    goto done;
nomem:
    PyErr_NoMemory();
done:
    PyBuffer_Release(&info_t);
    PyBuffer_Release(&view_t);
    PyBuffer_Release(&probe_t);
    return result;
}

/* A TFRecord table's feature keys, [image key] or [image key, label key] (bytes), and the mask's key (bytes, or None
 * for no mask) after them, into e->keys (kinds "b", "bi", "bb" or "bib") and e->mask_cell. */
static int set_keys(Engine *e, PyObject *keys, PyObject *mask_key) {
    e->mask_cell = -1;
    if (mask_key != Py_None && !PyBytes_Check(mask_key)) {
        PyErr_SetString(PyExc_TypeError, "mask_key must be bytes or None");
        return -1;
    }
    PyObject *seq = keys == Py_None ? NULL : PySequence_Fast(keys, "keys must be a sequence of bytes");
    Py_ssize_t m = seq ? PySequence_Fast_GET_SIZE(seq) : 0, total = 0;
    if (seq == NULL || m < 1 || m > 2) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "a TFRecord table needs keys: [image key] or [image key, label key]");
        Py_XDECREF(seq);
        return -1;
    }
    for (Py_ssize_t k = 0; k < m; ++k) {
        if (!PyBytes_Check(PySequence_Fast_GET_ITEM(seq, k))) {
            PyErr_SetString(PyExc_TypeError, "keys must be bytes");
            Py_DECREF(seq);
            return -1;
        }
        total += PyBytes_GET_SIZE(PySequence_Fast_GET_ITEM(seq, k));
    }
    if (mask_key != Py_None)
        total += PyBytes_GET_SIZE(mask_key);
    if ((e->key_block = malloc((size_t)total + 1)) == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    char *at = e->key_block;
    for (Py_ssize_t k = 0; k < m; ++k) {
        PyObject *key = PySequence_Fast_GET_ITEM(seq, k);
        Py_ssize_t len = PyBytes_GET_SIZE(key);
        memcpy(at, PyBytes_AS_STRING(key), (size_t)len);
        e->keys.keys[k] = at;
        e->keys.lens[k] = len;
        at += len;
    }
    e->keys.m = m;
    e->keys.kinds = m == 1 ? "b" : "bi";
    if (mask_key != Py_None) {
        memcpy(at, PyBytes_AS_STRING(mask_key), (size_t)PyBytes_GET_SIZE(mask_key));
        e->keys.keys[m] = at;
        e->keys.lens[m] = PyBytes_GET_SIZE(mask_key);
        e->mask_cell = (int)m;
        e->keys.m = m + 1;
        e->keys.kinds = m == 1 ? "bb" : "bib";
    }
    Py_DECREF(seq);
    return 0;
}

/* A framed table's record layout, [codes] (one bytes value: its records' field kind codes in order, each of image
 * 1, int 3 and mask 10 at most once, the image's given; None: image, int), and the mask's key (None, or b"\x0a":
 * the mask field's code), into e->framed, e->nframed and e->mask_cell. */
static int set_framed(Engine *e, PyObject *keys, PyObject *mask_key) {
    static const unsigned char plain[] = {FRAMED_IMAGE, FRAMED_INT};
    const unsigned char *codes = plain;
    Py_ssize_t n = 2;
    PyObject *seq = NULL;
    e->mask_cell = -1;
    if (keys != Py_None) {
        seq = PySequence_Fast(keys, "keys must be a sequence of bytes");
        if (seq == NULL)
            return -1;
        PyObject *one = PySequence_Fast_GET_SIZE(seq) == 1 ? PySequence_Fast_GET_ITEM(seq, 0) : NULL;
        if (one == NULL || !PyBytes_Check(one)) {
            Py_DECREF(seq);
            PyErr_SetString(PyExc_ValueError, "a framed table's keys are one bytes value: its fields' kind codes");
            return -1;
        }
        codes = (const unsigned char *)PyBytes_AS_STRING(one);
        n = PyBytes_GET_SIZE(one);
    }
    int images = 0, ints = 0, masks = 0, ok = n <= FRAMED_MAX;
    for (Py_ssize_t f = 0; ok && f < n; ++f) {
        images += codes[f] == FRAMED_IMAGE;
        ints += codes[f] == FRAMED_INT;
        masks += codes[f] == FRAMED_MASK;
        ok = codes[f] == FRAMED_IMAGE || codes[f] == FRAMED_INT || codes[f] == FRAMED_MASK;
    }
    ok = ok && images == 1 && ints <= 1 && masks <= 1;
    if (ok && mask_key != Py_None) {
        ok = PyBytes_Check(mask_key) && PyBytes_GET_SIZE(mask_key) == 1 &&
             (unsigned char)PyBytes_AS_STRING(mask_key)[0] == FRAMED_MASK && masks == 1;
        for (Py_ssize_t f = 0; ok && f < n; ++f)
            if (codes[f] == FRAMED_MASK)
                e->mask_cell = (int)f;
    }
    if (ok) {
        memcpy(e->framed, codes, (size_t)n);
        e->nframed = (int)n;
    }
    Py_XDECREF(seq);
    if (!ok)
        PyErr_SetString(PyExc_ValueError, "a framed table's fields are an image (kind code 1) and at most one int "
                                          "(3) and one mask (10), its mask key b'\\x0a' where it has a mask");
    return ok ? 0 : -1;
}

static int Engine_init(Engine *e, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"paths", "files", "offsets", "sizes", "labels", "format", "desc", "seed", "batch_size",
                             "slots", "read_threads", "max_pixels", "regions", "gpu", "nice", "crcs", "keys",
                             "record_crc", "python", "mask_key", "mask_fill", "hw", "mask_offsets",
                             "mask_sizes", "mask_crcs", "host_share", NULL};
    PyObject *paths, *files, *offsets, *sizes, *labels, *desc_obj, *gpu = Py_None, *crcs = Py_None, *keys = Py_None,
             *python = Py_None, *mask_key = Py_None, *hw = Py_None, *mask_offsets = Py_None, *mask_sizes = Py_None,
             *mask_crcs = Py_None;
    int format, regions, nice = 0, record_crc = 0, mask_fill = 255;
    double host_share = 0.0;
    unsigned long long seed;
    Py_ssize_t batch, slots, threads;
    long long max_pixels;
    if (e->pid != 0) {
        PyErr_SetString(PyExc_RuntimeError, "an Engine is initialised once");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOOiOKnnnLp|OiOOpOOiOOOOd:Engine", kwlist, &paths, &files,
                                     &offsets, &sizes, &labels, &format, &desc_obj, &seed, &batch, &slots, &threads,
                                     &max_pixels, &regions, &gpu, &nice, &crcs, &keys, &record_crc, &python,
                                     &mask_key, &mask_fill, &hw, &mask_offsets, &mask_sizes, &mask_crcs, &host_share))
        return -1;
    if (!(host_share >= 0.0 && host_share <= 1.0)) {
        PyErr_SetString(PyExc_ValueError, "Engine: host_share is a share, from 0 to 1");
        return -1;
    }
    if ((mask_key != Py_None && format != FMT_TFRECORD && format != FMT_FRAMED) || mask_fill < 0 || mask_fill > 255) {
        PyErr_SetString(PyExc_ValueError, "Engine: a mask key is for a TFRecord or framed table, its fill 0..255");
        return -1;
    }
    if ((hw != Py_None) != (format == FMT_PIXELS)) {
        PyErr_SetString(PyExc_ValueError, "Engine: a pixels table, and only one, gives each sample's height and width");
        return -1;
    }
    if ((mask_offsets != Py_None) != (mask_sizes != Py_None) ||
        (mask_offsets != Py_None && (format != FMT_WHOLE || mask_key != Py_None)) ||
        (mask_crcs != Py_None && mask_offsets == Py_None)) {
        PyErr_SetString(PyExc_ValueError, "Engine: mask ranges (offsets and sizes, and optionally their CRC32Cs) are "
                                          "for a 'whole' table, without a mask key");
        return -1;
    }
    if (mask_key != Py_None || mask_offsets != Py_None) {
        const char *why = ing_png_load();
        if (why != NULL) {
            PyErr_SetString(PyExc_ImportError, why);
            return -1;
        }
    }
    if (format < 0 || format >= FMT_COUNT || batch < 1 || slots < 1 || threads < 1 || max_pixels < 1 || nice < 0 ||
        nice > 19) {
        PyErr_SetString(PyExc_ValueError,
                        "Engine: format, batch_size, slots, read_threads, max_pixels or nice out of range");
        return -1;
    }
    if (pthread_mutex_init(&e->lock, NULL) || pthread_cond_init(&e->cond, NULL)) {
        PyErr_SetString(PyExc_RuntimeError, "Engine: cannot make a lock");
        return -1;
    }
    e->pid = getpid();
    e->format = format;
    e->batch = batch;
    e->nslots = slots;
    e->max_pixels = max_pixels;
    e->regions = regions;
    e->nice = nice;
    e->host_share = host_share;
    e->record_crc = format == FMT_TFRECORD && record_crc;
    e->mask_cell = -1;
    if (format == FMT_TFRECORD && set_keys(e, keys, mask_key) < 0)
        goto fail;
    if (format == FMT_FRAMED && set_framed(e, keys, mask_key) < 0)
        goto fail;
    /* the table */
    if (!PyList_Check(paths)) {
        PyErr_SetString(PyExc_TypeError, "paths must be a list");
        goto fail;
    }
    e->nfiles = PyList_GET_SIZE(paths);
    int64_t n = -1;
    if ((e->files = copy_int64s(files, -1, &n, "files")) == NULL)
        goto fail;
    e->n = n;
    /* offsets, sizes and labels live in one block after files: copy each, then move them in */
    int64_t *off = copy_int64s(offsets, n, NULL, "offsets"), *siz = off ? copy_int64s(sizes, n, NULL, "sizes") : NULL;
    int64_t *lab = NULL;
    if (siz && labels != Py_None)
        lab = copy_int64s(labels, n, NULL, "labels");
    if (off == NULL || siz == NULL || (labels != Py_None && lab == NULL)) {
        free(off);
        free(siz);
        free(lab);
        goto fail;
    }
    int64_t *block = realloc(e->files, (size_t)(n ? n : 1) * 4 * sizeof(int64_t));
    if (block == NULL) {
        free(off);
        free(siz);
        free(lab);
        PyErr_NoMemory();
        goto fail;
    }
    e->files = block;
    e->offsets = block + n;
    e->sizes = block + 2 * n;
    memcpy(e->offsets, off, (size_t)n * 8);
    memcpy(e->sizes, siz, (size_t)n * 8);
    if (lab) {
        e->labels = block + 3 * n;
        memcpy(e->labels, lab, (size_t)n * 8);
    }
    free(off);
    free(siz);
    free(lab);
    if (crcs != Py_None && (e->crcs = copy_crcs(crcs, n, "crcs")) == NULL)
        goto fail;
    if (python != Py_None) {
        Py_buffer v;
        if (PyObject_GetBuffer(python, &v, PyBUF_C_CONTIGUOUS) < 0)
            goto fail;
        if (v.len != n || (e->python = malloc((size_t)(n ? n : 1))) == NULL) {
            if (v.len != n)
                PyErr_Format(PyExc_ValueError, "python holds %zd bytes, one per sample (%lld) needed", v.len,
                             (long long)n);
            else
                PyErr_NoMemory();
            PyBuffer_Release(&v);
            goto fail;
        }
        memcpy(e->python, v.buf, (size_t)n);
        PyBuffer_Release(&v);
    }
    if (mask_offsets != Py_None) {
        if ((e->mask_off = copy_int64s(mask_offsets, n, NULL, "mask_offsets")) == NULL ||
            (e->mask_size = copy_int64s(mask_sizes, n, NULL, "mask_sizes")) == NULL)
            goto fail;
        for (int64_t i = 0; i < n; ++i) /* (a sample the table leaves to Python may be anything) */
            if ((e->python == NULL || !e->python[i]) && (e->mask_off[i] < 0 || e->mask_size[i] < 0 || e->sizes[i] < 0)) {
                PyErr_Format(PyExc_ValueError, "sample %lld: its image and mask ranges must have offsets and sizes "
                             "(got mask %lld + %lld, image size %lld)", (long long)i, (long long)e->mask_off[i],
                             (long long)e->mask_size[i], (long long)e->sizes[i]);
                goto fail;
            }
    }
    if (mask_crcs != Py_None && (e->mask_crcs = copy_crcs(mask_crcs, n, "mask_crcs")) == NULL)
        goto fail;
    e->masks = e->mask_cell >= 0 || e->mask_off != NULL;
    e->host_png = format != FMT_PIXELS && ing_png_load() == NULL; /* (without zlib, PNG images are Python's) */
    if (hw != Py_None) {
        if ((e->pixel_hw = copy_int64s(hw, 2 * n, NULL, "hw")) == NULL)
            goto fail;
        for (int64_t i = 0; i < n; ++i) { /* (a sample the table leaves to Python may be anything) */
            int64_t h = e->pixel_hw[2 * i], w = e->pixel_hw[2 * i + 1];
            if ((e->python == NULL || !e->python[i]) &&
                (h < 1 || w < 1 || h > INT32_MAX || w > INT32_MAX || e->sizes[i] / 3 / h != w ||
                 e->sizes[i] != h * w * 3)) {
                PyErr_Format(PyExc_ValueError, "sample %lld: %lld bytes do not hold %lld x %lld x 3 pixels",
                             (long long)i, (long long)e->sizes[i], (long long)e->pixel_hw[2 * i],
                             (long long)e->pixel_hw[2 * i + 1]);
                goto fail;
            }
        }
    }
    for (int64_t i = 0; i < n; ++i)
        if (e->files[i] < 0 || e->files[i] >= e->nfiles || e->offsets[i] < 0) {
            PyErr_Format(PyExc_ValueError, "sample %lld: file %lld or offset %lld out of range", (long long)i,
                         (long long)e->files[i], (long long)e->offsets[i]);
            goto fail;
        }
    size_t total = 0;
    for (int64_t f = 0; f < e->nfiles; ++f) {
        PyObject *bytes = NULL;
        if (!PyUnicode_FSConverter(PyList_GET_ITEM(paths, f), &bytes))
            goto fail;
        total += (size_t)PyBytes_GET_SIZE(bytes) + 1;
        Py_DECREF(bytes);
    }
    e->paths = calloc((size_t)(e->nfiles ? e->nfiles : 1), sizeof(char *));
    e->path_block = malloc(total ? total : 1);
    if (e->paths == NULL || e->path_block == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    char *at = e->path_block;
    for (int64_t f = 0; f < e->nfiles; ++f) {
        PyObject *bytes = NULL;
        if (!PyUnicode_FSConverter(PyList_GET_ITEM(paths, f), &bytes))
            goto fail;
        size_t len = (size_t)PyBytes_GET_SIZE(bytes);
        memcpy(at, PyBytes_AS_STRING(bytes), len + 1);
        e->paths[f] = at;
        at += len + 1;
        Py_DECREF(bytes);
    }
    e->keep_open = e->nfiles <= KEEP_OPEN_FILES;
    if (e->keep_open) {
        if ((e->fds = malloc((size_t)(e->nfiles ? e->nfiles : 1) * sizeof(int))) == NULL) {
            PyErr_NoMemory();
            goto fail;
        }
        for (int64_t f = 0; f < e->nfiles; ++f)
            e->fds[f] = -1;
    }
    /* the chain */
    Py_buffer desc;
    if (PyObject_GetBuffer(desc_obj, &desc, PyBUF_C_CONTIGUOUS) < 0)
        goto fail;
    int st = desc.len % 8 ? ING_EINVAL : ing_chain_parse(&e->chain, desc.buf, desc.len / 8, (uint64_t)seed);
    PyBuffer_Release(&desc);
    if (st != ING_OK) {
        PyErr_Format(PyExc_ValueError, "desc: %s", ing_strerror(st));
        goto fail;
    }
    /* the chain's fixed output size: plan one 64 x 64 and one 480 x 640 sample (the Python side checked it); a
     * PIXELS table's first sample's size twice (raw shards of one pixel shape: a chain whose output follows the
     * image's gives one size; a row planned to another falls back, WHY_PLAN) */
    {
        int64_t idx[2] = {0, 1}, hw[4] = {64, 64, 480, 640};
        for (int64_t i = 0; e->pixel_hw != NULL && i < n; ++i)
            if (e->python == NULL || !e->python[i]) {
                hw[0] = hw[2] = e->pixel_hw[2 * i];
                hw[1] = hw[3] = e->pixel_hw[2 * i + 1];
                break;
            }
        ing_sample two[2];
        ing_plan_out out = {.sample = two, .params = NULL};
        if ((st = ing_plan(&e->chain, 2, idx, 0, hw, &out)) != ING_OK) {
            PyErr_Format(PyExc_ValueError, "desc: %s", ing_strerror(st));
            goto fail;
        }
        if (two[0].out_hw[0] != two[1].out_hw[0] || two[0].out_hw[1] != two[1].out_hw[1]) {
            two[0].out_hw[0] = two[0].out_hw[1] = 0; /* sizes vary: only set_detection's rows take its samples */
        }
        e->out_h = two[0].out_hw[0];
        e->out_w = two[0].out_hw[1];
        e->row_elems = e->out_h * e->out_w * e->chain.channels;
    }
    e->mchain = e->chain; /* the masks' chain: the same ops, one uint8 channel filled with the mask's fill */
    e->mchain.channels = 1;
    e->mchain.normalize = 0;
    e->mchain.kind = 0;
    e->mchain.nchw = 0;
    memset(e->mchain.fill, 0, sizeof e->mchain.fill);
    e->mchain.fill[0] = (double)mask_fill;
    /* per batch and per slot */
    int64_t B = batch;
    e->slot_out = calloc((size_t)slots, sizeof(CUdeviceptr));
    e->slot_lbl = calloc((size_t)slots, sizeof(CUdeviceptr));
    e->slot_args = calloc((size_t)slots, sizeof(CUdeviceptr));
    e->slot_mask = calloc((size_t)slots, sizeof(CUdeviceptr));
    e->slot_host = calloc((size_t)slots, sizeof(unsigned char *));
    e->slot_notes = calloc((size_t)slots, sizeof(Note *));
    e->slot_nnotes = calloc((size_t)slots, sizeof(int64_t));
    e->slot_ready = calloc((size_t)slots, sizeof(CUevent));
    e->slot_free = calloc((size_t)slots, sizeof(CUevent));
    e->slot_stream = calloc((size_t)slots, sizeof(unsigned long long));
    e->posted = calloc(QCAP, sizeof(Posted));
    for (int64_t s = 0; e->slot_stream && s < slots; ++s)
        e->slot_stream[s] = NO_STREAM;
    e->free_slots = calloc((size_t)slots, sizeof(int));
    e->slot_given = calloc((size_t)slots, 1);
    e->pending = calloc((size_t)slots, sizeof(int));
    e->slot_held = calloc((size_t)slots * 3, 1);
    e->slot_idx = calloc((size_t)slots, sizeof(Py_buffer));
    e->slot_pad = calloc((size_t)slots, sizeof(Py_buffer));
    e->slot_dry = calloc((size_t)slots, sizeof(Py_buffer));
    e->g_pos = calloc((size_t)B * 20, sizeof(int64_t));
    e->p_src = calloc((size_t)B, sizeof(uint64_t));
    e->p_plan = calloc((size_t)B, sizeof(ing_sample));
    if (!e->slot_out || !e->slot_lbl || !e->slot_args || !e->slot_mask || !e->slot_host || !e->slot_notes || !e->slot_nnotes ||
        !e->slot_ready || !e->slot_free || !e->slot_stream || !e->posted || !e->free_slots || !e->slot_given || !e->pending || !e->slot_held || !e->slot_idx ||
        !e->slot_pad || !e->slot_dry || !e->g_pos || !e->p_src || !e->p_plan) {
        PyErr_NoMemory();
        goto fail;
    }
    e->g_reg = e->g_pos + B;
    e->g_org = e->g_reg + 4 * B;
    e->g_dec = e->g_org + 2 * B;
    e->g_aoff = e->g_dec + 2 * B;
    e->g_row = e->g_aoff + B;
    e->p_org = e->g_row + B;
    e->p_dec = e->p_org + 2 * B;
    e->p_row = e->p_dec + 2 * B;
    e->p_pos = e->p_row + B;
    e->p_hw = e->p_pos + B;
    e->g_nv = e->p_hw + 2 * B; /* 20 B in all */
    for (int64_t s = 0; s < slots; ++s)
        if ((e->slot_notes[s] = calloc((size_t)B, sizeof(Note))) == NULL) {
            PyErr_NoMemory();
            goto fail;
        }
    for (int k = 0; k < JOBS; ++k) {
        if (alloc_job(e, &e->jobs[k]) < 0) {
            PyErr_NoMemory();
            goto fail;
        }
        e->free_jobs[e->nfree_jobs++] = &e->jobs[k];
    }
    if (gpu != Py_None) {
        if (setup_gpu(e, gpu) < 0)
            goto fail;
    } else {
        for (int64_t s = 0; s < slots; ++s)
            if ((e->slot_host[s] = calloc((size_t)B, sizeof(int64_t))) == NULL) {
                PyErr_NoMemory();
                goto fail;
            }
    }
    for (int64_t s = slots - 1; s >= 0; --s) /* slot 0 is taken first */
        e->free_slots[e->nfree_slots++] = (int)s;
    /* threads */
    if (team_init(&e->readers, e, (int)threads) < 0 || team_init(&e->decoders, e, e->gpu ? e->ndec : 1) < 0) {
        e->teams_made = 1;
        PyErr_SetString(PyExc_RuntimeError, "Engine: cannot start its threads");
        goto fail;
    }
    e->teams_made = 1;
    if ((e->png_workers = calloc((size_t)e->readers.size, sizeof(ing_png_worker))) == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    if (pthread_create(&e->reader, NULL, reader_main, e) != 0) {
        PyErr_SetString(PyExc_RuntimeError, "Engine: cannot start its reader thread");
        goto fail;
    }
    e->reader_started = 1;
    if (pthread_create(&e->decoder, NULL, decoder_main, e) != 0) {
        PyErr_SetString(PyExc_RuntimeError, "Engine: cannot start its decode thread");
        goto fail;
    }
    e->decoder_started = 1;
    return 0;
fail:
    e->closed = 1;
    Py_BEGIN_ALLOW_THREADS
    engine_join(e);
    engine_free(e);
    Py_END_ALLOW_THREADS
    release_buffers(e);
    return -1;
}

/* -- methods ----------------------------------------------------------------------------------------------- */

static PyObject *Engine_add_epoch(Engine *e, PyObject *args) {
    long long epoch, number0;
    PyObject *indices, *bounds, *pad;
    if (!PyArg_ParseTuple(args, "LLOOO:add_epoch", &epoch, &number0, &indices, &bounds, &pad) || !alive(e))
        return NULL;
    Epoch *ep = calloc(1, sizeof(Epoch));
    if (ep == NULL)
        return PyErr_NoMemory();
    int64_t count = 0, nb = 0;
    Py_buffer p = {0};
    int have_pad = 0;
    if ((ep->indices = copy_int64s(indices, -1, &count, "indices")) == NULL ||
        (ep->bounds = copy_int64s(bounds, -1, &nb, "bounds")) == NULL)
        goto bad;
    if (PyObject_GetBuffer(pad, &p, PyBUF_C_CONTIGUOUS) < 0)
        goto bad;
    have_pad = 1;
    if (p.len != count || nb < 1 || ep->bounds[0] != 0 || ep->bounds[nb - 1] != count) {
        PyErr_SetString(PyExc_ValueError, "add_epoch: pad must hold a byte per index and bounds run from 0 to the "
                                          "number of indices");
        goto bad;
    }
    for (int64_t b = 0; b + 1 < nb; ++b)
        if (ep->bounds[b + 1] <= ep->bounds[b] || ep->bounds[b + 1] - ep->bounds[b] > e->batch) {
            PyErr_Format(PyExc_ValueError, "add_epoch: batch %lld holds %lld samples (1 to %lld allowed)",
                         (long long)b, (long long)(ep->bounds[b + 1] - ep->bounds[b]), (long long)e->batch);
            goto bad;
        }
    for (int64_t k = 0; k < count; ++k)
        if (ep->indices[k] < 0 || ep->indices[k] >= e->n) {
            PyErr_Format(PyExc_IndexError, "add_epoch: dataset index %lld is out of range (%lld samples)",
                         (long long)ep->indices[k], (long long)e->n);
            goto bad;
        }
    if ((ep->pad = malloc(count ? (size_t)count : 1)) == NULL) {
        PyErr_NoMemory();
        goto bad;
    }
    memcpy(ep->pad, p.buf, (size_t)count);
    PyBuffer_Release(&p);
    ep->epoch = epoch;
    ep->number0 = number0;
    ep->batches = nb - 1;
    pthread_mutex_lock(&e->lock);
    if (e->epochs_tail)
        e->epochs_tail->next = ep;
    else
        e->epochs = ep;
    e->epochs_tail = ep;
    pthread_cond_broadcast(&e->cond);
    pthread_mutex_unlock(&e->lock);
    Py_RETURN_NONE;
bad:
    if (have_pad)
        PyBuffer_Release(&p);
    free(ep->indices);
    free(ep->bounds);
    free(ep->pad);
    free(ep);
    return NULL;
}

/* Holds `obj` as slot buffer `which` (0 indices, 1 pad, 2 dry) of `bytes`, replacing one held before. */
static int hold(Engine *e, int64_t slot, int which, PyObject *obj, Py_ssize_t bytes) {
    Py_buffer *views[3] = {e->slot_idx, e->slot_pad, e->slot_dry};
    Py_buffer v;
    if (PyObject_GetBuffer(obj, &v, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    if (v.len < bytes) {
        PyErr_Format(PyExc_ValueError, "set_slot: a buffer of %zd bytes where %zd are needed", v.len, bytes);
        PyBuffer_Release(&v);
        return -1;
    }
    pthread_mutex_lock(&e->lock);
    Py_buffer old = views[which][slot];
    int had = e->slot_held[3 * slot + which];
    views[which][slot] = v;
    e->slot_held[3 * slot + which] = 1;
    pthread_mutex_unlock(&e->lock);
    if (had)
        PyBuffer_Release(&old);
    return 0;
}

static PyObject *Engine_set_slot(Engine *e, PyObject *args) {
    Py_ssize_t slot;
    unsigned long long out, labels, masks = 0;
    PyObject *idx = Py_None, *pad = Py_None, *dry = Py_None;
    if (!PyArg_ParseTuple(args, "nKK|OOOK:set_slot", &slot, &out, &labels, &idx, &pad, &dry, &masks) || !alive(e))
        return NULL;
    PyObject *result = NULL;
    if (slot < 0 || slot >= e->nslots) {
        PyErr_Format(PyExc_IndexError, "slot %zd out of range", slot);
        goto done;
    }
    /* (only a slot that is out, Python's, is set: the engine reads these when it takes a slot) */
    if ((idx != Py_None && hold(e, slot, 0, idx, e->batch * 8) < 0) ||
        (pad != Py_None && hold(e, slot, 1, pad, e->batch) < 0) ||
        (dry != Py_None && hold(e, slot, 2, dry, e->batch * D_COLS * 8) < 0))
        goto done;
    pthread_mutex_lock(&e->lock);
    e->slot_out[slot] = (CUdeviceptr)out;
    e->slot_lbl[slot] = (CUdeviceptr)labels;
    e->slot_mask[slot] = (CUdeviceptr)masks;
    pthread_mutex_unlock(&e->lock);
    result = Py_NewRef(Py_None);
done:
    return result;
}

static PyObject *Engine_release(Engine *e, PyObject *args) {
    Py_ssize_t slot;
    unsigned long long stream = 0;
    if (!PyArg_ParseTuple(args, "n|K:release", &slot, &stream) || !alive(e))
        return NULL;
    if (slot < 0 || slot >= e->nslots) {
        PyErr_Format(PyExc_IndexError, "slot %zd out of range", slot);
        return NULL;
    }
    if (!e->slot_given[slot]) {
        PyErr_Format(PyExc_ValueError, "slot %zd was released twice (or before next() gave it)", slot);
        return NULL;
    }
    int64_t t0 = mono_ns();
    /* The decode thread records the slot's free event on this stream when it next takes the slot: later than now,
     * so after at least the work queued so far (no CUDA call here, with the GIL held). */
    e->slot_stream[slot] = stream;
    e->slot_given[slot] = 0;
    if (__atomic_load_n(&e->users, __ATOMIC_ACQUIRE) == 0) {
        e->pending[e->npending++] = (int)slot; /* the next next() hands it over, under the lock it takes anyway */
    } else { /* a next() waits (another thread's): hand it over now */
        pthread_mutex_lock(&e->lock);
        e->free_slots[e->nfree_slots++] = (int)slot;
        pthread_cond_broadcast(&e->cond);
        pthread_mutex_unlock(&e->lock);
    }
    e->gil_ns += mono_ns() - t0;
    Py_RETURN_NONE;
}

/* With e->lock held (released on return): hands back the slots the user released since the last call, waits for
 * a ready batch (or the stop, or starvation: every slot out and nothing ready) and takes it into *r. Returns 1 with
 * a batch; else 0 with *starved set, or the engine's error copied into `error` (empty: stopped without one). */
static int take_ready(Engine *e, const int *handed, int nhanded, Ready *r, int *starved, char *error) {
    int got = 0;
    for (int q = 0; q < nhanded; ++q)
        e->free_slots[e->nfree_slots++] = handed[q];
    if (nhanded)
        pthread_cond_broadcast(&e->cond);
    while (e->rq_len == 0 && !e->stop && !(e->starving && e->nfree_slots == 0 && e->inflight == 0))
        pthread_cond_wait(&e->cond, &e->lock);
    if (e->rq_len > 0) {
        *r = e->rq[e->rq_head];
        e->rq_head = (e->rq_head + 1) % QCAP;
        e->rq_len--;
        got = 1;
        if (r->kind == R_BATCH)
            e->slot_given[r->slot] = 1;
        pthread_cond_broadcast(&e->cond);
    } else if (e->stop) {
        memcpy(error, e->error, sizeof e->error);
        if (!error[0])
            snprintf(error, sizeof e->error, "the native engine stopped");
    } else {
        *starved = 1;
    }
    pthread_mutex_unlock(&e->lock);
    return got;
}

static PyObject *Engine_next(Engine *e, PyObject *args) {
    if (!PyArg_ParseTuple(args, ":next") || !enter_waiting(e))
        return NULL;
    int64_t t0 = mono_ns(), waited = 0;
    PyObject *result = NULL;
    Ready r;
    int got = 0, starved = 0;
    char error[sizeof e->error];
    error[0] = 0;
    int handed[64], nhanded = e->npending < 64 ? e->npending : 64; /* the slots released since the last call */
    memcpy(handed, e->pending, (size_t)nhanded * sizeof(int));
    e->npending -= nhanded;
    memmove(e->pending, e->pending + nhanded, (size_t)e->npending * sizeof(int));
    /* A batch already waiting is taken with the GIL kept: giving it up costs the training thread a wait of up to
     * the interpreter's switch interval to get it back from a busy Python thread. Otherwise wait without it. */
    if (pthread_mutex_trylock(&e->lock) == 0) {
        if (e->rq_len > 0 || e->stop)
            got = take_ready(e, handed, nhanded, &r, &starved, error);
        else
            pthread_mutex_unlock(&e->lock);
    }
    if (!got && !starved && !error[0]) {
        int64_t t1 = mono_ns();
        Py_BEGIN_ALLOW_THREADS
        pthread_mutex_lock(&e->lock);
        got = take_ready(e, handed, nhanded, &r, &starved, error);
        Py_END_ALLOW_THREADS
        waited = mono_ns() - t1;
    }
    if (!got) {
        if (starved)
            result = Py_NewRef(Py_None);
        else
            PyErr_SetString(PyExc_RuntimeError, error);   /* (take_ready names the stop) */
        goto done;
    }
    if (r.kind == R_EPOCH) {
        result = Py_BuildValue("(iiLLLO)", R_EPOCH, -1, (long long)r.epoch, 0LL, 0LL, Py_None);
        goto done;
    }
    e->handed++;
    PyObject *notes = Py_NewRef(Py_None);
    int64_t count = e->slot_nnotes[r.slot];
    if (count > 0) {
        Py_DECREF(notes);
        if ((notes = PyList_New(count)) == NULL)
            goto done;
        for (int64_t q = 0; q < count; ++q) {
            Note *t = &e->slot_notes[r.slot][q];
            PyObject *item = Py_BuildValue("(LLLLL)", (long long)t->index, (long long)t->row, (long long)t->stage,
                                           (long long)t->code, (long long)t->status);
            if (item == NULL) {
                Py_DECREF(notes);
                goto done;
            }
            PyList_SET_ITEM(notes, q, item);
        }
    }
    result = Py_BuildValue("(iiLLLN)", R_BATCH, r.slot, (long long)r.epoch, (long long)r.number, (long long)r.rows,
                           notes);
done:
    e->gil_ns += mono_ns() - t0 - waited;
    leave(e);
    return result;
}

static PyObject *Engine_labels(Engine *e, PyObject *args) {
    Py_ssize_t slot;
    if (!PyArg_ParseTuple(args, "n:labels", &slot) || !alive(e))
        return NULL;
    if (slot < 0 || slot >= e->nslots) {
        PyErr_Format(PyExc_IndexError, "slot %zd out of range", slot);
        return NULL;
    } /* a copy: the host labels of a slot's last batch */
    return PyBytes_FromStringAndSize((const char *)e->slot_host[slot], e->batch * 8);
}

static PyObject *Engine_close(Engine *e, PyObject *unused) {
    if (e->pid != getpid()) {
        PyErr_SetString(PyExc_RuntimeError, "this native engine belongs to the parent process (forked)");
        return NULL;
    }
    engine_close(e);
    Py_RETURN_NONE;
}

/* ({name: mean ms per batch}, {name: [ms of each of the first batches]}) of the stage times (T_*). */
static PyObject *stage_times(const int64_t *sum, const int64_t (*first)[T_COUNT], int64_t timed) {
    PyObject *mean = PyDict_New(), *rows = PyDict_New();
    int64_t nfirst = timed < T_FIRST ? timed : T_FIRST;
    for (int s = 0; mean != NULL && rows != NULL && s < T_COUNT; ++s) {
        PyObject *m = PyFloat_FromDouble(timed > 0 ? (double)sum[s] / (double)timed / 1e6 : 0.0);
        PyObject *list = PyList_New(nfirst);
        for (int64_t b = 0; list != NULL && b < nfirst; ++b)
            PyList_SET_ITEM(list, b, PyFloat_FromDouble((double)first[b][s] / 1e6));
        int bad = m == NULL || list == NULL || PyDict_SetItemString(mean, T_NAMES[s], m) < 0 ||
                  PyDict_SetItemString(rows, T_NAMES[s], list) < 0;
        Py_XDECREF(m);
        Py_XDECREF(list);
        if (bad)
            Py_CLEAR(mean);
    }
    PyObject *pair = mean != NULL && rows != NULL ? Py_BuildValue("(OO)", mean, rows) : NULL;
    Py_XDECREF(mean);
    Py_XDECREF(rows);
    return pair;
}

static PyObject *Engine_stats(Engine *e, PyObject *unused) {
    if (!alive(e))
        return NULL;
    int64_t sum[T_COUNT], first[T_FIRST][T_COUNT];
    pthread_mutex_lock(&e->lock);
    long long v[8] = {e->st_batches, e->st_samples, e->st_fallbacks, e->st_failures, e->st_bytes, e->st_arena_allocs,
                      e->st_starved,
                      (long long)(e->arena_cap[0] > e->arena_cap[1] ? e->arena_cap[0] : e->arena_cap[1])};
    memcpy(sum, e->t_sum, sizeof sum);
    memcpy(first, e->t_first, sizeof first);
    pthread_mutex_unlock(&e->lock);
    PyObject *stages = stage_times(sum, (const int64_t (*)[T_COUNT])first, v[0]);
    if (stages == NULL)
        return NULL;
    PyObject *out = Py_BuildValue("{sLsLsLsLsLsLsLsLsLsLsOsO}", "batches", v[0], "samples", v[1], "fallbacks", v[2],
                                  "failures", v[3], "bytes_read", v[4], "arenas_made", v[5], "slot_waits", v[6],
                                  "arena_bytes", v[7], "gil_ns", (long long)e->gil_ns, "handed", (long long)e->handed,
                                  "stage_ms", PyTuple_GET_ITEM(stages, 0), "first_stage_ms",
                                  PyTuple_GET_ITEM(stages, 1));
    Py_DECREF(stages);
    return out;
}

static PyObject *Engine_output_size(Engine *e, void *unused) {
    return Py_BuildValue("(LL)", (long long)e->out_h, (long long)e->out_w);
}

static PyMethodDef Engine_methods[] = {
    {"add_epoch", (PyCFunction)Engine_add_epoch, METH_VARARGS,
     "add_epoch(epoch, number0, indices, bounds, pad): queue an epoch's batches (see the top of engine.c)."},
    {"set_slot", (PyCFunction)Engine_set_slot, METH_VARARGS,
     "set_slot(k, out, labels[, indices, pad, dry, masks]): slot k's device addresses and host arrays."},
    {"release", (PyCFunction)Engine_release, METH_VARARGS,
     "release(k[, stream]): slot k is free once the work queued on stream so far has run."},
    {"next", (PyCFunction)Engine_next, METH_VARARGS,
     "next() -> (kind, slot, epoch, number, rows, notes) or None (every slot is out); a batch comes finished."},
    {"labels", (PyCFunction)Engine_labels, METH_VARARGS, "labels(k) -> bytes: slot k's host labels."},
    {"close", (PyCFunction)Engine_close, METH_NOARGS, "Stop and join every thread, free everything native."},
    {"stats", (PyCFunction)Engine_stats, METH_NOARGS, "Counts: batches, samples, fallbacks, failures, ..."},
    {"set_detection", (PyCFunction)Engine_set_detection, METH_VARARGS,
     "set_detection(boxes, starts, fields, sample_fields, box_format, relative, declared, stride, batchwide): the "
     "dataset's boxes and fields, once, before the first epoch (engine_det.h)."},
    {"set_targets", (PyCFunction)Engine_set_targets, METH_VARARGS,
     "set_targets(k, device, host, info): slot k's target buffers (engine_det.h)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Engine_getset[] = {
    {"output_size", (getter)Engine_output_size, NULL, "The chain's fixed output (height, width).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject EngineType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ingest._engine.Engine",
    .tp_basicsize = sizeof(Engine),
    .tp_dealloc = (destructor)Engine_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The native engine (see ingest/_native/engine.c).",
    .tp_methods = Engine_methods,
    .tp_getset = Engine_getset,
    .tp_init = (initproc)Engine_init,
    .tp_new = PyType_GenericNew,
};

/* -- module-level helpers for tests: the engine's parse and header scan on single buffers ------------------- */

static PyObject *py_recordio_image(PyObject *self, PyObject *args) {
    Py_buffer b;
    if (!PyArg_ParseTuple(args, "y*:recordio_image", &b))
        return NULL;
    int64_t start, end, label;
    int ok = recordio_image(b.buf, b.len, &start, &end, &label);
    PyBuffer_Release(&b);
    if (!ok)
        Py_RETURN_NONE;
    return Py_BuildValue("(LLL)", (long long)start, (long long)end, (long long)label);
}

/* record(bytes, kind[, keys, check, mask_key]) -> (start, end, label) of its image (with a mask key, then the
 * mask's start and length), None where the engine leaves it to Python, or (TFRecord, check) the TF_* code of a CRC
 * that fails: the engine's parse of one record of a table kind. */
static PyObject *py_record_image(PyObject *self, PyObject *args) {
    Py_buffer b;
    int format, check = 0;
    PyObject *keys = Py_None, *mask_key = Py_None;
    if (!PyArg_ParseTuple(args, "y*i|OpO:record_image", &b, &format, &keys, &check, &mask_key))
        return NULL;
    Engine scratch; /* (only its format and keys are read) */
    memset(&scratch, 0, sizeof scratch);
    scratch.format = format;
    PyObject *result = NULL;
    int64_t start = 0, end = 0, label = -1, mask[2] = {0, -1};
    if (format <= FMT_WHOLE || format >= FMT_COUNT) {
        PyErr_Format(PyExc_ValueError, "record_image: format %d is not a record format", format);
        goto done;
    }
    scratch.mask_cell = -1;
    if (format == FMT_TFRECORD && set_keys(&scratch, keys, mask_key) < 0)
        goto done;
    if (format == FMT_FRAMED && set_framed(&scratch, keys, mask_key) < 0)
        goto done;
    int code = format == FMT_TFRECORD && check ? tfrecord_check(b.buf, b.len) : TF_OK;
    if (code == TF_LENGTH_CRC || code == TF_DATA_CRC)
        result = PyLong_FromLong(code);
    else if (!record_image(&scratch, b.buf, b.len, &start, &end, &label, mask))
        result = Py_NewRef(Py_None);
    else if (scratch.mask_cell >= 0)
        result = Py_BuildValue("(LLLLL)", (long long)start, (long long)end, (long long)label, (long long)mask[0],
                               (long long)mask[1]);
    else
        result = Py_BuildValue("(LLL)", (long long)start, (long long)end, (long long)label);
done:
    free(scratch.key_block);
    PyBuffer_Release(&b);
    return result;
}

/* png_image(bytes) -> (height, width, RGB bytes) as the read team decodes an image (png_decode.h, rgb), None where
 * it leaves the PNG to Pillow, or the message (str) of one it refuses. */
static PyObject *py_png_image(PyObject *self, PyObject *args) {
    Py_buffer b;
    if (!PyArg_ParseTuple(args, "y*:png_image", &b))
        return NULL;
    const char *why = ing_png_load();
    if (why != NULL) {
        PyBuffer_Release(&b);
        PyErr_SetString(PyExc_ImportError, why);
        return NULL;
    }
    ing_png png = {.data = b.buf, .len = (size_t)b.len, .rgb = 1, .offset = -1};
    ing_png_worker worker = {0};
    PyObject *out = NULL, *result = NULL;
    if (ing_png_header(&png) == ING_PNG_DECODED) {
        out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)png.width * png.height * 3);
        if (out == NULL)
            goto done;
        png.out = (uint8_t *)PyBytes_AS_STRING(out);
        Py_BEGIN_ALLOW_THREADS
        ing_png_decode(&png, &worker);
        Py_END_ALLOW_THREADS
    }
    if (png.status == ING_PNG_DECODED)
        result = Py_BuildValue("(IIO)", png.height, png.width, out);
    else if (png.status == ING_PNG_REFUSED)
        result = PyUnicode_FromString(png.message);
    else
        result = Py_NewRef(Py_None);
done:
    Py_XDECREF(out);
    ing_png_worker_free(&worker);
    PyBuffer_Release(&b);
    return result;
}

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, .m_name = "_engine", .m_size = -1};

static PyMethodDef functions[] = {
    {"recordio_image", py_recordio_image, METH_VARARGS,
     "recordio_image(record) -> (start, end, label) of its image, or None where the engine leaves it to Python."},
    {"record_image", py_record_image, METH_VARARGS,
     "record_image(record, format[, keys, check, mask_key]) -> (start, end, label) of its image (and, with a mask "
     "key, the mask's start and length), None where the engine leaves "
     "it to Python, or (a TFRecord record, check) the code of its CRC that fails (1 length, 2 data)."},
    {"png_image", py_png_image, METH_VARARGS,
     "png_image(data) -> (height, width, RGB bytes) as the engine's read team decodes a PNG image, None where it "
     "leaves it to Pillow, or the message of one it refuses."},
    {NULL, NULL, 0, NULL},
};

PyMODINIT_FUNC PyInit__engine(void) {
    ing_crc32c_init();
    if (PyType_Ready(&EngineType) < 0)
        return NULL;
    module.m_methods = functions;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&EngineType);
    if (PyModule_AddObject(m, "Engine", (PyObject *)&EngineType) < 0 ||
        PyModule_AddIntConstant(m, "WHOLE", FMT_WHOLE) < 0 ||
        PyModule_AddIntConstant(m, "RECORDIO", FMT_RECORDIO) < 0 ||
        PyModule_AddIntConstant(m, "TFRECORD", FMT_TFRECORD) < 0 ||
        PyModule_AddIntConstant(m, "CAFFE_DATUM", FMT_CAFFE_DATUM) < 0 ||
        PyModule_AddIntConstant(m, "FRAMED", FMT_FRAMED) < 0 ||
        PyModule_AddIntConstant(m, "BATCH", R_BATCH) < 0 || PyModule_AddIntConstant(m, "EPOCH_END", R_EPOCH) < 0 ||
        PyModule_AddIntConstant(m, "NOTE_READ", NOTE_READ) < 0 ||
        PyModule_AddIntConstant(m, "NOTE_FALLBACK", NOTE_FALLBACK) < 0 ||
        PyModule_AddIntConstant(m, "NOTE_CORRUPT", NOTE_CORRUPT) < 0 ||
        PyModule_AddIntConstant(m, "NOTE_HOST", NOTE_HOST) < 0 ||
        PyModule_AddIntConstant(m, "DRY_COLUMNS", D_COLS) < 0) {
        Py_DECREF(&EngineType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
